"""The Qwen-Image VAE family (diffusers' `AutoencoderKLQwenImage`): Wan's code and mapping file under its own class,
config and model names."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName
from .config import QwenImageVAEConfig


def _flax_model():
    from .modeling_flax import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage


def _torch_model():
    from .modeling_torch import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage


def _testing():
    from .testing import TESTING

    return TESTING


QWENIMAGE = FamilySpec(
    name="qwenimage",
    config_class=QwenImageVAEConfig,
    flax_model=_flax_model,
    torch_model=_torch_model,
    testing=_testing,
    mapping_file="wan.yaml",  # the same keys and layouts as AutoencoderKLWan's
    models=(
        ModelName("qwen-image", "Qwen/Qwen-Image"),
        ModelName("qwen-image-edit", "Qwen/Qwen-Image-Edit"),
        ModelName("qwen-image-edit-2509", "Qwen/Qwen-Image-Edit-2509"),
    ),
    # an image model: its validation decodes one latent frame and encodes one image, to a latent of the same size
    validation_latent_shape=lambda c: (1, c.z_dim, 1, 8, 8),
    validation_video_shape=lambda c: (1, c.input_channels, 1, 8 * c.scale_factor_spatial, 8 * c.scale_factor_spatial),
    clamps_output=True,
)
