"""MiniMax-H3's video VAE (diffusers' AutoencoderKLMiniMaxH3) in Flax NNX and in PyTorch for torchax."""
