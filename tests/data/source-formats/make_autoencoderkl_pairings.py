"""Writes the AutoencoderKL pairings beside this script, each listing every key of a file with its shape and the
diffusers key it becomes:

- autoencoderkl-legacy-attention.json: a diffusers AutoencoderKL file saved before diffusers 0.14, whose mid-block
  attention projections are `query`, `key`, `value` and `proj_attn`. The pairing is diffusers' own:
  `ModelMixin._fix_state_dict_keys_on_load`, the renaming `from_pretrained` applies to such files, run on the legacy
  names of SD 1.5's VAE (built on the meta device).
- autoencoderkl-ldm.json, autoencoderkl-bfl-flux1.json, autoencoderkl-ldm-checkpoint.json,
  autoencoderkl-sd3-checkpoint.json: the original (CompVis/LDM) layout: a standalone SD VAE file, BFL's Flux.1
  `ae.safetensors` (no quant convs), and the VAE inside a whole SD/SDXL or SD3 checkpoint (under `first_stage_model.`
  or `vae.`, the two prefixes diffusers' single-file loader looks for: the `-vae-prefix` files).
  The pairing is diffusers' single-file converter, `convert_ldm_vae_checkpoint`: each LDM tensor holds a value of
  its own, and the converter's output tells which diffusers key each became; every LDM key must be used once and
  every key of diffusers' model produced.
- autoencoderkl-bfl-flux2.json: BFL's Flux.2 VAE file: the LDM layout with the quant convs inside `encoder.` and
  `decoder.` and the BatchNorm's running statistics. The pairing is diffusers'
  `convert_flux2_vae_checkpoint_to_diffusers` from `scripts/convert_flux2_to_diffusers.py` in the diffusers
  repository (not in the wheel: pass the script's path), its definitions run on their own, followed by the
  `load_state_dict` the script does, which sets the BatchNorm's count of batches the file lacks to 0.

    .venv/bin/python tests/data/source-formats/make_autoencoderkl_pairings.py PATH/TO/convert_flux2_to_diffusers.py
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import OrderedDict
from pathlib import Path

import diffusers
import torch

HERE = Path(__file__).resolve().parent
SD15_CONFIG = dict(
    block_out_channels=[128, 256, 512, 512],
    down_block_types=["DownEncoderBlock2D"] * 4,
    up_block_types=["UpDecoderBlock2D"] * 4,
    layers_per_block=2,
    sample_size=512,
)
OLD_NAMES = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def legacy_key(key: str) -> str:
    for new, old in OLD_NAMES.items():
        key = key.replace(f".attentions.0.{new}.", f".attentions.0.{old}.")
    return key


SD3_CONFIG = dict(SD15_CONFIG, sample_size=1024, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
LDM_NAMES = {"conv_norm_out": "norm_out", "conv_shortcut": "nin_shortcut", "downsamplers.0": "downsample"}
LDM_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def ldm_key(key: str, levels: int) -> str:
    """The LDM name of a diffusers key: diffusers' converter read backwards, for it to check."""
    for new, old in LDM_NAMES.items():
        key = key.replace(new, old)
    key = re.sub(r"down_blocks\.(\d+)\.resnets\.", r"down.\1.block.", key)
    key = re.sub(r"down_blocks\.(\d+)\.downsample", r"down.\1.downsample", key)
    key = re.sub(r"up_blocks\.(\d+)\.resnets\.", lambda m: f"up.{levels - 1 - int(m[1])}.block.", key)
    key = re.sub(r"up_blocks\.(\d+)\.upsamplers\.0", lambda m: f"up.{levels - 1 - int(m[1])}.upsample", key)
    key = re.sub(r"mid_block\.resnets\.(\d)", lambda m: f"mid.block_{int(m[1]) + 1}", key)
    for new, old in LDM_ATTENTION.items():
        key = key.replace(f"mid_block.attentions.0.{new}.", f"mid.attn_1.{old}.")
    return key


def ldm_pairings(config: dict, prefix: str, about: str) -> dict:
    """The LDM file of `config`'s VAE (1x1 attention convolutions, the decoder's levels numbered from the top) and
    what diffusers' converter makes of each of its keys."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    with torch.device("meta"):
        expected = diffusers.AutoencoderKL(**config).state_dict()
    levels = len(config["block_out_channels"])
    original = {}
    for i, (key, tensor) in enumerate(expected.items()):
        shape = (*tensor.shape, 1, 1) if ".attentions.0.to_" in key and key.endswith("weight") else tuple(tensor.shape)
        original[prefix + ldm_key(key, levels)] = torch.full(shape, float(i))
    converted = convert_ldm_vae_checkpoint(original, config)
    assert {k: v.shape for k, v in converted.items()} == {k: v.shape for k, v in expected.items()}
    becomes = {int(v.flatten()[0]): k for k, v in converted.items()}
    assert len(becomes) == len(original) == len(expected)  # every LDM tensor used once
    return {
        "file": about,
        "model_code": "diffusers AutoencoderKL, keys as diffusers' single-file converter reads them",
        "pairing": "diffusers' convert_ldm_vae_checkpoint (loaders/single_file_utils.py)",
        "original_config": config,
        "keys": {k: {"shape": list(v.shape), "diffusers": becomes[int(v.flatten()[0])]} for k, v in original.items()},
    }


LDM_FILES = {
    "autoencoderkl-ldm.json": (SD15_CONFIG, "", "a standalone SD 1.x/2.x/SDXL VAE file in the LDM layout"),
    "autoencoderkl-bfl-flux1.json": (SD3_CONFIG, "", "BFL's Flux.1 ae.safetensors (the LDM layout, no quant convs)"),
    "autoencoderkl-ldm-checkpoint.json": (
        SD15_CONFIG,
        "first_stage_model.",
        "a whole SD 1.x/2.x/SDXL checkpoint, its VAE under first_stage_model.",
    ),
    "autoencoderkl-sd3-checkpoint.json": (
        SD3_CONFIG,
        "first_stage_model.",
        "a whole SD3 checkpoint (sd3_medium.safetensors), its VAE under first_stage_model.",
    ),
    "autoencoderkl-ldm-checkpoint-vae-prefix.json": (
        SD15_CONFIG,
        "vae.",
        "a whole SD 1.x/2.x/SDXL checkpoint, its VAE under vae.",
    ),
    "autoencoderkl-sd3-checkpoint-vae-prefix.json": (SD3_CONFIG, "vae.", "a whole SD3 checkpoint, its VAE under vae."),
}


FLUX2_CONFIG = dict(SD15_CONFIG, sample_size=1024, latent_channels=32)
# the diffusers keys BFL's Flux.2 file keeps inside the coders
FLUX2_INSIDE = {"quant_conv.": "encoder.quant_conv.", "post_quant_conv.": "decoder.post_quant_conv."}
FLUX2_CONVERTER = (
    "DIFFUSERS_VAE_TO_FLUX2_MAPPING",
    "conv_attn_to_linear",
    "update_vae_resnet_ldm_to_diffusers",
    "update_vae_attentions_ldm_to_diffusers",
    "convert_flux2_vae_checkpoint_to_diffusers",
)


def script_definitions(path: Path, names: tuple[str, ...]) -> dict:
    """The named top-level definitions of one of diffusers' conversion scripts, run on their own: the script itself
    parses the command line and imports every pipeline dependency when imported."""
    tree = ast.parse(path.read_text())

    def named(node) -> str | None:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            return node.targets[0].id
        return getattr(node, "name", None)

    kept = [node for node in tree.body if named(node) in names]
    assert sorted(map(named, kept)) == sorted(names), f"{path} lacks some of {names}"
    namespace = {"torch": torch}
    exec(compile(ast.Module(kept, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def flux2_pairings(script: Path) -> dict:
    """BFL's Flux.2 VAE file (every tensor holding a value of its own) and what diffusers' converter makes of it."""
    convert = script_definitions(script, FLUX2_CONVERTER)["convert_flux2_vae_checkpoint_to_diffusers"]
    with torch.device("meta"):
        expected = diffusers.AutoencoderKLFlux2(**FLUX2_CONFIG).state_dict()
    original = {}
    for i, (key, tensor) in enumerate(expected.items()):
        if key == "bn.num_batches_tracked":  # BFL's file has none
            continue
        shape = (*tensor.shape, 1, 1) if ".attentions.0.to_" in key and key.endswith("weight") else tuple(tensor.shape)
        inside = next((key.replace(k, v, 1) for k, v in FLUX2_INSIDE.items() if key.startswith(k)), None)
        original[inside or ldm_key(key, len(FLUX2_CONFIG["block_out_channels"]))] = torch.full(shape, float(i))
    converted = convert(original, FLUX2_CONFIG)
    model = diffusers.AutoencoderKLFlux2(**FLUX2_CONFIG)
    model.load_state_dict(converted, strict=True)  # as the script loads it
    assert model.bn.num_batches_tracked.item() == 0
    assert {k: v.shape for k, v in converted.items()} == {
        k: v.shape for k, v in expected.items() if k != "bn.num_batches_tracked"
    }
    becomes = {int(v.flatten()[0]): k for k, v in converted.items()}
    assert len(becomes) == len(original) == len(expected) - 1  # every BFL tensor used once
    return {
        "file": "BFL's Flux.2 VAE file (flux2-vae.safetensors): the LDM layout, the quant convs inside the coders, bn",
        "model_code": "diffusers AutoencoderKLFlux2, keys as diffusers' Flux.2 conversion script reads them",
        "pairing": "diffusers' convert_flux2_vae_checkpoint_to_diffusers (scripts/convert_flux2_to_diffusers.py), "
        "then load_state_dict, which sets bn.num_batches_tracked to 0",
        "original_config": FLUX2_CONFIG,
        "keys": {k: {"shape": list(v.shape), "diffusers": becomes[int(v.flatten()[0])]} for k, v in original.items()},
    }


if __name__ == "__main__":
    content = flux2_pairings(Path(sys.argv[1]))
    (HERE / "autoencoderkl-bfl-flux2.json").write_text(json.dumps(content, indent=1) + "\n")
    print(f"autoencoderkl-bfl-flux2.json: {len(content['keys'])} keys")
    for name, (config, prefix, about) in LDM_FILES.items():
        content = ldm_pairings(config, prefix, about)
        (HERE / name).write_text(json.dumps(content, indent=1) + "\n")
        print(f"{name}: {len(content['keys'])} keys")
    with torch.device("meta"):
        model = diffusers.AutoencoderKL(**SD15_CONFIG)
    current = model.state_dict()
    legacy = OrderedDict((legacy_key(k), v) for k, v in current.items())
    original_of = {id(v): k for k, v in legacy.items()}
    model._fix_state_dict_keys_on_load(legacy)  # renames in place, the tensors kept
    assert legacy.keys() == current.keys()
    content = {
        "file": "a diffusers AutoencoderKL file saved before diffusers 0.14 (query, key, value, proj_attn)",
        "model_code": "diffusers AutoencoderKL with SD 1.5's config",
        "pairing": "diffusers' ModelMixin._fix_state_dict_keys_on_load, as from_pretrained applies it",
        "original_config": SD15_CONFIG,
        "keys": {original_of[id(v)]: {"shape": list(v.shape), "diffusers": k} for k, v in legacy.items()},
    }
    (HERE / "autoencoderkl-legacy-attention.json").write_text(json.dumps(content, indent=1) + "\n")
    print(f"autoencoderkl-legacy-attention.json: {len(content['keys'])} keys")
