"""Writes the LTX-Video pairings files beside this script: every VAE key of each released single-file layout, with its
shape and the diffusers key it becomes. The original keys come from Lightricks' own model code (`CausalVideoAutoencoder`
of the `ltx-video` package, built on the meta device from the layout's metadata config, `vae.`-prefixed as the single
files hold them, with the latent statistics the files carry); the diffusers keys from diffusers' own converter
(`convert_ltx_vae_checkpoint_to_diffusers`), which moves each tensor object to its new key. The package pins an old
huggingface-hub: install it with --no-deps (and einops) into a folder of its own, then

    PYTHONPATH=/path/to/that/folder .venv/bin/python tests/data/source-formats/make_ltx_pairings.py
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers.loaders.single_file_utils import convert_ltx_vae_checkpoint_to_diffusers
from ltx_video.models.autoencoders.causal_video_autoencoder import CausalVideoAutoencoder

from converter.models.ltx.original import ORIGINAL_CONFIGS, STATISTICS, diffusers_config

HERE = Path(__file__).resolve().parent


def pairing(layout: str) -> dict:
    config = ORIGINAL_CONFIGS[layout]
    with torch.device("meta"):
        model = CausalVideoAutoencoder.from_config(json.loads(json.dumps(config)))
    tensors = {f"vae.{k}": v for k, v in model.state_dict().items()}
    for name in STATISTICS:
        tensors[f"vae.per_channel_statistics.{name}"] = torch.empty(config["latent_channels"], device="meta")
    original_of = {id(v): k for k, v in tensors.items()}
    converted = convert_ltx_vae_checkpoint_to_diffusers(dict(tensors))
    keys = {original_of[id(v)]: k for k, v in converted.items()}
    return {
        "file": f"LTX-Video {layout} single file: the VAE's keys (vae.*) among the transformer's",
        "model_code": "ltx-video (PyPI): ltx_video/models/autoencoders/causal_video_autoencoder.py",
        "pairing": "diffusers.loaders.single_file_utils.convert_ltx_vae_checkpoint_to_diffusers",
        "original_config": config,
        "diffusers_config": diffusers_config(config),
        "keys": {k: {"shape": list(tensors[k].shape), "diffusers": keys[k]} for k in tensors if k in keys},
    }


if __name__ == "__main__":
    for layout in ORIGINAL_CONFIGS:
        content = pairing(layout)
        (HERE / f"ltx-{layout}.json").write_text(json.dumps(content, indent=1) + "\n")
        print(f"ltx-{layout}.json: {len(content['keys'])} keys")
