"""The Qwen-Image 2.1 VAE family (diffusers' `AutoencoderKLQwenImage21`): Wan 2.2's code with 2-D convolutions, its
own mapping file (the keys are Wan's, the kernels 4-D), config and model name."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import QwenImage21VAEConfig

QWENIMAGE21 = FamilySpec(
    name="qwenimage21",
    config_class=QwenImage21VAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLQwenImage21"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLQwenImage21"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="qwenimage21.yaml",
    models=(ModelName("qwen-image-2.1", "Qwen/Qwen-Image-2.1"),),
    # an image class with a frame axis of one (B, C, 1, H, W): its validation decodes one latent frame and encodes
    # one image, to a latent of the same size
    validation_latent_shape=lambda c: (1, c.z_dim, 1, 8, 8),
    validation_sample_shape=lambda c: (1, c.video_channels, 1, 8 * c.spatial_ratio, 8 * c.spatial_ratio),
    clamps_output=True,
    native_size=(1, 1024, 1024),
)
