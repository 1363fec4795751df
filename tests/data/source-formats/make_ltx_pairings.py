"""Writes the LTX pairings files beside this script: every VAE key of each released single-file layout, with its shape
and the diffusers key it becomes.

The original keys come from Lightricks' own model code, built on the meta device from the layout's metadata config,
`vae.`-prefixed as the single files hold them, with the latent statistics the files carry: LTX-Video's
`CausalVideoAutoencoder` (the `ltx-video` package) and LTX-2's `VideoEncoder` and `ConvVideoDecoder` (ltx-core, in
Lightricks' LTX-2 repository). The diffusers keys come from diffusers' own converters
(`convert_ltx_vae_checkpoint_to_diffusers`, `convert_ltx2_vae_to_diffusers`), which move each tensor object to its new
key. diffusers' LTX-2 table stops at LTX-2.0's three decoder levels; LTX-2.3's fourth level is renamed as the table
renames the others. Every layout's keys and shapes are then checked against diffusers' model built from the translated
config. ltx-video pins an old huggingface-hub: install it with --no-deps (and einops) into a folder of its own, then

    PYTHONPATH=/path/to/that/folder:/path/to/LTX-2/packages/ltx-core/src \\
        .venv/bin/python tests/data/source-formats/make_ltx_pairings.py
"""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
import torch
from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers, convert_ltx_vae_checkpoint_to_diffusers
from ltx_core.model.video_vae.model_configurator import VideoDecoderConfigurator, VideoEncoderConfigurator
from ltx_video.models.autoencoders.causal_video_autoencoder import CausalVideoAutoencoder

from converter.models.ltx.original import (
    LTX2_ORIGINAL_CONFIGS,
    ORIGINAL_CONFIGS,
    STATISTICS,
    ltx2_config,
    ltx_video_config,
)

HERE = Path(__file__).resolve().parent
# LTX-2.3's fourth decoder level (original up_blocks 7 and 8), past the end of diffusers' table
LTX2_FOURTH_LEVEL = {
    "decoder.up_blocks.7.": "decoder.up_blocks.3.upsamplers.0.",
    "decoder.up_blocks.8.": "decoder.up_blocks.3.",
}


def ltx_video_tensors(config: dict) -> dict:
    with torch.device("meta"):
        model = CausalVideoAutoencoder.from_config(json.loads(json.dumps(config)))
    return {f"vae.{k}": v for k, v in model.state_dict().items()}


def ltx2_tensors(config: dict) -> dict:
    metadata = {"config": {"vae": json.loads(json.dumps(config))}}
    with torch.device("meta"):
        parts = {
            "encoder": VideoEncoderConfigurator.from_metadata(metadata),
            "decoder": VideoDecoderConfigurator.from_metadata(metadata),
        }
    # the file keeps one copy of the statistics both parts hold
    return {
        f"vae.{part}.{k}": v
        for part, model in parts.items()
        for k, v in model.state_dict().items()
        if not k.startswith("per_channel_statistics.")
    }


def ltx2_converter(tensors: dict) -> dict:
    converted = convert_ltx2_vae_to_diffusers(tensors)
    out = {}
    for key, value in converted.items():
        for old, new in LTX2_FOURTH_LEVEL.items():
            key = key.replace(old, new)
        out[key] = value
    return out


GENERATIONS = {
    "ltx": (
        ORIGINAL_CONFIGS,
        ltx_video_tensors,
        convert_ltx_vae_checkpoint_to_diffusers,
        ltx_video_config,
        diffusers.AutoencoderKLLTXVideo,
        "ltx-video (PyPI): ltx_video/models/autoencoders/causal_video_autoencoder.py",
        "diffusers.loaders.single_file_utils.convert_ltx_vae_checkpoint_to_diffusers",
    ),
    "ltx2": (
        LTX2_ORIGINAL_CONFIGS,
        ltx2_tensors,
        ltx2_converter,
        ltx2_config,
        diffusers.AutoencoderKLLTX2Video,
        "Lightricks/LTX-2: packages/ltx-core/src/ltx_core/model/video_vae (VideoEncoder, ConvVideoDecoder)",
        "diffusers.loaders.single_file_utils.convert_ltx2_vae_to_diffusers",
    ),
}


def pairing(generation: str, layout: str) -> dict:
    configs, make_tensors, convert, translate, diffusers_class, model_code, converter = GENERATIONS[generation]
    config = configs[layout]
    tensors = make_tensors(config)
    for name in STATISTICS:
        tensors[f"vae.per_channel_statistics.{name}"] = torch.empty(config["latent_channels"], device="meta")
    original_of = {id(v): k for k, v in tensors.items()}
    converted = convert(dict(tensors))
    with torch.device("meta"):
        expected = diffusers_class.from_config(translate(config)).state_dict()
    shapes = {k: tuple(v.shape) for k, v in converted.items()}
    assert shapes == {k: tuple(v.shape) for k, v in expected.items()}, f"{generation} {layout}: not diffusers' layout"
    keys = {original_of[id(v)]: k for k, v in converted.items()}
    if layout.startswith("2.3"):
        converter += ", its table extended by LTX-2.3's fourth decoder level (up_blocks 7 and 8)"
    return {
        "file": f"LTX {layout} single file: the VAE's keys (vae.*) among the other models' keys",
        "model_code": model_code,
        "pairing": converter,
        "original_config": config,
        "diffusers_config": translate(config),
        "keys": {k: {"shape": list(tensors[k].shape), "diffusers": keys[k]} for k in tensors if k in keys},
    }


if __name__ == "__main__":
    for generation, (configs, *_) in GENERATIONS.items():
        for layout in configs:
            content = pairing(generation, layout)
            (HERE / f"ltx-{layout}.json").write_text(json.dumps(content, indent=1) + "\n")
            print(f"ltx-{layout}.json: {len(content['keys'])} keys")
