"""Qwen-Image 2.1's VAE (diffusers' AutoencoderKLQwenImage21): Wan 2.2's blocks with every causal convolution a 2-D
one over the single frame."""
