"""Writes the AutoencoderKL pairings beside this script:

- autoencoderkl-legacy-attention.json: every key of a diffusers AutoencoderKL file saved before diffusers 0.14, whose
  mid-block attention projections are `query`, `key`, `value` and `proj_attn`, with its shape and the key diffusers
  loads it as. The pairing is diffusers' own: `ModelMixin._fix_state_dict_keys_on_load`, the renaming
  `from_pretrained` applies to such files, run on the legacy names of SD 1.5's VAE (built on the meta device).

    .venv/bin/python tests/data/source-formats/make_autoencoderkl_pairings.py
"""

from __future__ import annotations

import json
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


if __name__ == "__main__":
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
