"""Writes minimaxh3audio-comfyui.json beside this script: every key of ComfyUI's MiniMax-H3 audio VAE file
(`minimax_h3_audio_vae_fp32.safetensors`) at the released config, with its shape and the diffusers key(s) it becomes.

ComfyUI's model code for it keeps diffusers' names, registers the latents' statistics as buffers, and loads plain
convolution weights, its weight norm folded: the file is diffusers' AutoencoderKLMiniMaxH3Audio with torch's own
`remove_weight_norm` run on every weight-normed convolution. The pairing is torch's: a folded `weight` is the
`weight_g` and `weight_v` it was made of; every other key stays. The latents' statistics are config fields
(`config_tensors`), which the pairings do not list.

    .venv/bin/python tests/data/source-formats/make_minimaxh3audio_pairings.py
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from diffusers import AutoencoderKLMiniMaxH3Audio

HERE = Path(__file__).resolve().parent


def folded(model: torch.nn.Module) -> dict[str, list[str]]:
    """torch's remove_weight_norm on each weight-normed module of `model`, in place: the key of each folded weight ->
    the diffusers keys it was made of."""
    made = {}
    for name, module in model.named_modules():
        if hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
            made[f"{name}.weight"] = [f"{name}.weight_g", f"{name}.weight_v"]
    return made


def main():
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch's weight_norm, which diffusers' class uses
        model = AutoencoderKLMiniMaxH3Audio()
        diffusers_keys = set(model.state_dict())
        made = folded(model)
    keys = {
        key: {"shape": list(tensor.shape), "diffusers": made.get(key, key)}
        for key, tensor in model.state_dict().items()
    }
    assert {
        k for v in keys.values() for k in ([v["diffusers"]] if isinstance(v["diffusers"], str) else v["diffusers"])
    } == diffusers_keys
    pairing = {
        "file": "ComfyUI's MiniMax-H3 audio VAE (minimax_h3_audio_vae_fp32.safetensors)",
        "model_code": "diffusers AutoencoderKLMiniMaxH3Audio at its defaults (the released config)",
        "pairing": "torch.nn.utils.remove_weight_norm on each weight-normed convolution (ComfyUI's model code loads "
        "the folded weights, diffusers' names otherwise)",
        "keys": keys,
    }
    (HERE / "minimaxh3audio-comfyui.json").write_text(json.dumps(pairing, indent=1) + "\n")


if __name__ == "__main__":
    main()
