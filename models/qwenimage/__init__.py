"""Qwen-Image's VAE (diffusers' AutoencoderKLQwenImage): Wan 2.1's architecture under its own class and config."""
