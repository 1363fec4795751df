"""Qwen-Image's VAE in Flax NNX: Wan 2.1's model (diffusers' autoencoder_kl_qwenimage.py differs from
autoencoder_kl_wan.py in names only), under its own class so that a saved model knows its family."""

from __future__ import annotations

from ..wan.modeling_flax import AutoencoderKLWan


class AutoencoderKLQwenImage(AutoencoderKLWan):
    pass
