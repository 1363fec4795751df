"""LTX-2's audio VAE (diffusers' AutoencoderKLLTX2Audio) in Flax NNX and in PyTorch for torchax."""
