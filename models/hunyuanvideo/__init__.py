"""HunyuanVideo's video VAE (diffusers' AutoencoderKLHunyuanVideo) in Flax NNX and in PyTorch for torchax."""
