"""The image VAE families: SD 1.x/2.x, SDXL, SD3/3.5, Flux.1 and Z-Image (diffusers' `AutoencoderKL`: one class,
configs that differ in latent channels, the 1x1 convolutions around the latent and the latent scaling), and Flux.2
(`AutoencoderKLFlux2`: the same encoder and decoder, and a BatchNorm's statistics for the pipelines)."""

from __future__ import annotations

from ..common.spec import FamilySpec, ModelName, lazy
from .config import AutoencoderKLConfig, AutoencoderKLFlux2Config, config_from_shapes, flux2_config_from_shapes

# The four levels every published AutoencoderKL has (diffusers' class defaults are a one-level toy model)
_LEVELS = dict(
    block_out_channels=[128, 256, 512, 512],
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    layers_per_block=2,
)
SD15_CONFIG = dict(_LEVELS, sample_size=512)
SDXL_CONFIG = dict(_LEVELS, sample_size=1024, scaling_factor=0.13025, force_upcast=True)
SDXL_FP16_FIX_CONFIG = dict(_LEVELS, sample_size=512, scaling_factor=0.13025, force_upcast=False)
# SD3 and Flux.1: 16 latent channels, no 1x1 convolutions around the latent, a shift before the scaling
_SD3_LAYOUT = dict(_LEVELS, sample_size=1024, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
SD3_CONFIG = dict(_SD3_LAYOUT, scaling_factor=1.5305, shift_factor=0.0609)
FLUX1_CONFIG = dict(_SD3_LAYOUT, scaling_factor=0.3611, shift_factor=0.1159)
# Flux.2: the class defaults (four levels, 32 latent channels, quant convs, 2x2 patches for the BatchNorm)
FLUX2_CONFIG = dict(_LEVELS, sample_size=1024, latent_channels=32)
FLUX2_SMALL_DECODER_CONFIG = dict(FLUX2_CONFIG, decoder_block_out_channels=[96, 192, 384, 384])

# images (B, C, H, W), no frame axis: validation decodes one 8x8 latent and encodes one image to a latent of that size
_IMAGE = dict(
    validation_latent_shape=lambda c: (1, c.latent_channels, 8, 8),
    validation_sample_shape=lambda c: (1, c.in_channels, 8 * c.spatial_ratio, 8 * c.spatial_ratio),
    native_size=(1024, 1024),
    frame_axis=False,
)

AUTOENCODERKL = FamilySpec(
    name="autoencoderkl",
    config_class=AutoencoderKLConfig,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKL"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKL"),
    testing=lazy(__package__, ".testing", "TESTING"),
    mapping_file="autoencoderkl.yaml",
    models=(
        ModelName("sd1.5", "stable-diffusion-v1-5/stable-diffusion-v1-5", config=SD15_CONFIG),
        ModelName("sdxl", "stabilityai/stable-diffusion-xl-base-1.0", config=SDXL_CONFIG),
        ModelName("sdxl-fp16-fix", "madebyollin/sdxl-vae-fp16-fix", subfolder="", config=SDXL_FP16_FIX_CONFIG),
        ModelName("sd3-medium", "stabilityai/stable-diffusion-3-medium-diffusers", config=SD3_CONFIG),
        ModelName("sd3.5-large", "stabilityai/stable-diffusion-3.5-large", config=SD3_CONFIG),
        ModelName("flux.1-dev", "black-forest-labs/FLUX.1-dev", config=FLUX1_CONFIG),
        ModelName("flux.1-schnell", "black-forest-labs/FLUX.1-schnell", config=FLUX1_CONFIG),
        ModelName("z-image-turbo", "Tongyi-MAI/Z-Image-Turbo", config=FLUX1_CONFIG),
    ),
    config_from_shapes=config_from_shapes,
    **_IMAGE,
)

FLUX2 = FamilySpec(
    name="flux2",
    config_class=AutoencoderKLFlux2Config,
    flax_model=lazy(__package__, ".modeling_flax", "AutoencoderKLFlux2"),
    torch_model=lazy(__package__, ".modeling_torch", "AutoencoderKLFlux2"),
    testing=lazy(__package__, ".testing", "TESTING_FLUX2"),
    mapping_file="autoencoderkl.yaml",
    models=(
        ModelName("flux.2-dev", "black-forest-labs/FLUX.2-dev", config=FLUX2_CONFIG),
        ModelName("flux.2-klein-4b", "black-forest-labs/FLUX.2-klein-4B", config=FLUX2_CONFIG),
        ModelName("flux.2-klein-9b", "black-forest-labs/FLUX.2-klein-9B", config=FLUX2_CONFIG),
        # a narrower decoder for Flux.2's latents; the repo's own page was not reached, so its layout is unverified
        ModelName(
            "flux.2-small-decoder",
            "black-forest-labs/FLUX.2-small-decoder",
            config=FLUX2_SMALL_DECODER_CONFIG,
            verified=False,
        ),
    ),
    # the BatchNorm's statistics, which Flux.2's pipelines normalise latents with
    recorded_tensors=("bn.running_mean", "bn.running_var"),
    config_from_shapes=flux2_config_from_shapes,
    **_IMAGE,
)
