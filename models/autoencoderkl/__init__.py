"""The image VAE of SD, SDXL, SD3 and Flux.1 (diffusers' AutoencoderKL) in Flax NNX and in PyTorch for torchax."""
