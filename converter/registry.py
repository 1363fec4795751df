"""Model families and the model names users type (`vae-convert wan2.1`).

A family ties together what is specific to one VAE architecture: its config class, its two implementations,
its mapping file, and the sample inputs validation runs. Everything else in converter/ is family-agnostic.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from converter.errors import InputError
from converter.mapping import MAPPINGS_DIR


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    class_name: str  # diffusers' class, as config.json's `_class_name` names it
    config_cls: str  # "module:attr", imported on demand so the CLI starts fast
    flax_cls: str
    torch_cls: str
    mapping_file: str
    # (config) -> shapes of the validation inputs, channels-first: latent (B, z, T, H, W), video (B, C, T, H, W)
    sample_latent_shape: Callable
    sample_video_shape: Callable
    # Extra configs `check-mappings` proves the rules against, beside the registered models' own.
    check_configs: tuple[tuple[str, dict], ...] = ()

    @property
    def mapping_path(self):
        return MAPPINGS_DIR / self.mapping_file

    def load(self, which: str):
        module, attr = getattr(self, which).split(":")
        return getattr(importlib.import_module(module), attr)

    def config_from_dict(self, raw: dict):
        return self.load("config_cls").from_dict(raw)


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    family: Family
    repo_id: str
    subfolder: str
    revision: str = "main"
    config: dict = dataclasses.field(default_factory=dict)  # what differs from the family's defaults


WAN21 = Family(
    name="wan2.1",
    class_name="AutoencoderKLWan",
    config_cls="models.wan.config:WanVAEConfig",
    flax_cls="models.wan.modeling_flax:AutoencoderKLWan",
    torch_cls="models.wan.modeling_torch:AutoencoderKLWan",
    mapping_file="wan2.1.yaml",
    sample_latent_shape=lambda c: (1, c.z_dim, 3, 8, 8),
    sample_video_shape=lambda c: (1, c.in_channels, 5, 32, 32),
    check_configs=(
        # attention in the encoder's down blocks, 3 levels, 1 res block, other temporal downsampling, own decoder width
        ("wan2.1-variant", dict(base_dim=8, decoder_base_dim=12, z_dim=8, dim_mult=[1, 2, 2], num_res_blocks=1,
                                attn_scales=[1.0], temperal_downsample=[True, False])),
    ),
)

COGVIDEOX = Family(
    name="cogvideox",
    class_name="AutoencoderKLCogVideoX",
    config_cls="models.cogvideox.config:CogVideoXVAEConfig",
    flax_cls="models.cogvideox.modeling_flax:AutoencoderKLCogVideoX",
    torch_cls="models.cogvideox.modeling_torch:AutoencoderKLCogVideoX",
    mapping_file="cogvideox.yaml",
    # 3 latent frames: one batch with an odd count (the first frame's own path in spatial norms and upsampling)
    sample_latent_shape=lambda c: (1, c.latent_channels, 3, 8, 8),
    sample_video_shape=lambda c: (1, c.in_channels, 9, 32, 32),
    check_configs=(
        # 2 levels, 1 layer per block, time compressed once, quant convs on (diffusers sizes them from out_channels)
        ("cogvideox-variant", dict(block_out_channels=[16, 32], down_block_types=["CogVideoXDownBlock3D"] * 2,
                                   up_block_types=["CogVideoXUpBlock3D"] * 2, layers_per_block=1, latent_channels=3,
                                   temporal_compression_ratio=2, norm_num_groups=4, use_quant_conv=True,
                                   use_post_quant_conv=True)),
    ),
)

FAMILIES = {f.name: f for f in (WAN21, COGVIDEOX)}

MODELS = {m.name: m for m in (
    ModelEntry("wan2.1", WAN21, "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", "vae"),
    # The three CogVideoX VAEs share an architecture; they differ in how the pipeline scales latents.
    ModelEntry("cogvideox-2b", COGVIDEOX, "THUDM/CogVideoX-2b", "vae", config=dict(scaling_factor=1.15258426)),
    ModelEntry("cogvideox-5b", COGVIDEOX, "THUDM/CogVideoX-5b", "vae", config=dict(scaling_factor=0.7)),
    ModelEntry("cogvideox1.5-5b", COGVIDEOX, "THUDM/CogVideoX1.5-5B", "vae",
               config=dict(scaling_factor=0.7, invert_scale_latents=True)),
)}


def configs_to_check(family: Family) -> list[tuple[str, dict]]:
    """Every config a family's mapping must hold for: each registered model's, then the family's extra ones."""
    return [(m.name, m.config) for m in MODELS.values() if m.family is family] + list(family.check_configs)


def get_model(name: str) -> ModelEntry:
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def family_for_class(class_name: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)
