"""The Qwen-Image VAE family (diffusers' `AutoencoderKLQwenImage`): Wan's code and mapping file under its own class,
config and model names."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import QwenImageVAEConfig

QWENIMAGE = FamilySpec(
    name="qwenimage",
    config_class=QwenImageVAEConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLQwenImage"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLQwenImage"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="wan.yaml",  # the same keys and layouts as AutoencoderKLWan's
    models=(
        ModelName("qwen-image", "Qwen/Qwen-Image"),
        ModelName("qwen-image-edit", "Qwen/Qwen-Image-Edit"),
        ModelName("qwen-image-edit-2509", "Qwen/Qwen-Image-Edit-2509"),
    ),
    # an image class with a frame axis of one (B, C, 1, H, W): its validation decodes one latent frame and encodes
    # one image, to a latent of the same size
    validation_latent_shape=lambda c: (1, c.z_dim, 1, 8, 8),
    validation_sample_shape=lambda c: (1, c.input_channels, 1, 8 * c.spatial_ratio, 8 * c.spatial_ratio),
    clamps_output=True,
    native_size=(1, 1024, 1024),
)
