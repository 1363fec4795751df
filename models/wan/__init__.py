"""Wan 2.1 video VAE (diffusers' AutoencoderKLWan) in Flax NNX and in PyTorch for torchax."""
