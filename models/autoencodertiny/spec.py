"""The tiny VAEs pipelines use for live previews (diffusers' `AutoencoderTiny`, madebyollin's TAESD, TAESDXL, TAESD3
and TAEF1): one class, configs that differ in latent channels. madebyollin's TAEF2 and TAESana are not of this class
(GroupNorm mid blocks; a stride-2 stem with changing widths) and do not convert."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderTinyConfig, config_from_shapes

# SD3's and Flux.1's 16 latent channels; the rest are the class defaults, TAESD's
SIXTEEN_CHANNELS = dict(latent_channels=16)

AUTOENCODERTINY = FamilySpec(
    name="autoencodertiny",
    config_class=AutoencoderTinyConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderTiny"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderTiny"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="autoencodertiny.yaml",
    # each repo keeps diffusers' files at its top, beside the original release's
    models=(
        ModelName("taesd", "madebyollin/taesd", subfolder=""),
        ModelName("taesdxl", "madebyollin/taesdxl", subfolder=""),
        ModelName("taesd3", "madebyollin/taesd3", subfolder="", config=SIXTEEN_CHANNELS),
        ModelName("taef1", "madebyollin/taef1", subfolder="", config=SIXTEEN_CHANNELS),
    ),
    # images (B, C, H, W), no frame axis: validation decodes one 8x8 latent and encodes one image to a latent of that
    # size; the encoder is deterministic: it gives latents, no distribution
    validation_latent_shape=lambda c: (1, c.latent_channels, 8, 8),
    validation_sample_shape=lambda c: (1, c.in_channels, 8 * c.spatial_ratio, 8 * c.spatial_ratio),
    native_size=(1024, 1024),
    frame_axis=False,
    encode_outputs=("latents",),
    config_from_shapes=config_from_shapes,
)
