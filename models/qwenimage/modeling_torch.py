"""Qwen-Image's VAE in PyTorch for torchax: Wan 2.1's model under its own class (diffusers' parameter names are the
same)."""

from __future__ import annotations

from ..wan.modeling_torch import AutoencoderKLWan


class AutoencoderKLQwenImage(AutoencoderKLWan):
    pass
