"""Writes minimaxh3-original.json beside this script: every key of MiniMax-H3's original video VAE file
(`{FL2VA,Ref2VA}/video_vae/source/model.safetensors`) at the released config, with its shape and the diffusers
key(s) it becomes; and, for a small config, the digest of each diffusers tensor diffusers' conversion makes of
seeded random original tensors, which the tests regenerate and convert (the values of the split and swapped
tensors, which keys alone do not prove).

The pairing is diffusers' own: `get_video_vae_key_plan` and `convert_video_vae_key` of
`scripts/convert_minimax_h3_to_diffusers.py` (in the diffusers repository, not the wheel: pass its path), run on
original tensors each holding a value of its own; its output loads into AutoencoderKLMiniMaxH3 strictly.

    .venv/bin/python tests/data/source-formats/make_minimaxh3_pairings.py PATH/TO/convert_minimax_h3_to_diffusers.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
from diffusers import AutoencoderKLMiniMaxH3

HERE = Path(__file__).resolve().parent
# diffusers' small test config (the script's MINIMAX_H3_TEST_VIDEO_VAE_CONFIG) at the widths of the project's small
# default architecture (models/minimaxh3/testing.py), with the released block structure (two resnets a level)
SMALL = dict(
    block_out_channels=[16, 32], layers_per_block=2, spatial_downsample_factors=[2, 2],
    temporal_downsample_factors=[2, 2], norm_num_groups=8, decoder_num_layers=2, decoder_num_attention_heads=2,
    decoder_attention_head_dim=24,
)  # fmt: skip
SEED = 0


def original_shapes(script, config: dict) -> dict[str, tuple]:
    """The original file's keys and shapes: the script's plan, each shape from the diffusers tensors it becomes (a
    split tensor's parts stacked along its rows); the dropped mask token (1, 1, width)."""
    with torch.device("meta"):
        diffusers_shapes = {k: tuple(v.shape) for k, v in AutoencoderKLMiniMaxH3(**config).state_dict().items()}
    shapes = {}
    for key, targets in script.get_video_vae_key_plan({**script.MINIMAX_H3_VIDEO_VAE_CONFIG, **config}).items():
        if not targets:
            width = config.get("decoder_num_attention_heads", 32) * config.get("decoder_attention_head_dim", 64)
            shapes[key] = (1, 1, width)
            continue
        parts = [diffusers_shapes[t] for t in targets]
        shapes[key] = (sum(p[0] for p in parts), *parts[0][1:]) if len(parts) > 1 else parts[0]
    return shapes


def converted(script, config: dict, original: dict) -> dict:
    full = {**script.MINIMAX_H3_VIDEO_VAE_CONFIG, **config}
    out = dict(pair for key, tensor in original.items() for pair in script.convert_video_vae_key(key, tensor, full))
    AutoencoderKLMiniMaxH3(**config).load_state_dict(out, strict=True, assign=True)
    return out


def main(script_path: str):
    spec = importlib.util.spec_from_file_location("convert_minimax_h3", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    # the released config at its size (10.4 GB) on the meta device: keys and shapes; the values are proven small
    released = dict(script.MINIMAX_H3_VIDEO_VAE_CONFIG)
    shapes = original_shapes(script, released)
    plan = script.get_video_vae_key_plan(released)
    with torch.device("meta"):
        made = converted(script, released, {k: torch.empty(shape) for k, shape in shapes.items()})
    assert set(made) == {t for targets in plan.values() for t in targets}
    keys = {
        key: {"shape": list(shapes[key]), "diffusers": targets[0] if len(targets) == 1 else targets}
        for key, targets in plan.items()
        if targets  # the mask token becomes nothing: the format's drop rule takes it
    }

    small_shapes = original_shapes(script, SMALL)
    generator = torch.Generator().manual_seed(SEED)
    small_original = {k: torch.randn(shape, generator=generator) for k, shape in small_shapes.items()}
    digests = {
        k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()
        for k, v in sorted(converted(script, SMALL, small_original).items())
    }
    pairing = {
        "file": "MiniMax-H3's video VAE as released ({FL2VA,Ref2VA}/video_vae/source/model.safetensors)",
        "model_code": "diffusers AutoencoderKLMiniMaxH3 at its defaults (the released config)",
        "pairing": "diffusers' scripts/convert_minimax_h3_to_diffusers.py (get_video_vae_key_plan, "
        "convert_video_vae_key)",
        "keys": keys,
        "small": {
            "config": SMALL,
            "seed": SEED,
            "draws": "torch.randn(shape, generator=torch.Generator().manual_seed(seed)) per key, in this order",
            "keys": [[k, list(s)] for k, s in small_shapes.items()],
            "diffusers_sha256": digests,
        },
    }
    (HERE / "minimaxh3-original.json").write_text(json.dumps(pairing, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
