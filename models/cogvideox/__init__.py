"""CogVideoX video VAE (diffusers' AutoencoderKLCogVideoX) in Flax NNX and in PyTorch for torchax."""
