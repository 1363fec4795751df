"""Writes ltx2audio-ltx-2.json beside this script: every key of the audio VAE in Lightricks' LTX-2 single files
(`audio_vae.` and the LDM-style names diffusers keeps, the latent statistics as `per_channel_statistics.*`), with its
shape and the diffusers key it becomes.

The pairing is diffusers' own: `convert_ltx2_audio_vae_to_diffusers` (diffusers/loaders/single_file_utils.py, the
single-file loader's converter for this class) run on the released config's keys, each tensor holding a value of its
own; its output says which diffusers key each became, and loads into AutoencoderKLLTX2Audio strictly.

    .venv/bin/python tests/data/source-formats/make_ltx2audio_pairings.py
"""

from __future__ import annotations

import json
from pathlib import Path

import diffusers
import torch
from diffusers.loaders.single_file_utils import convert_ltx2_audio_vae_to_diffusers

HERE = Path(__file__).resolve().parent
STATISTICS = {
    "latents_mean": "per_channel_statistics.mean-of-means",
    "latents_std": "per_channel_statistics.std-of-means",
}


def main():
    with torch.device("meta"):
        expected = diffusers.AutoencoderKLLTX2Audio().state_dict()
    original = {
        "audio_vae." + STATISTICS.get(key, key): torch.full(tuple(tensor.shape), float(i))
        for i, (key, tensor) in enumerate(expected.items())
    }
    converted = convert_ltx2_audio_vae_to_diffusers(dict(original))
    model = diffusers.AutoencoderKLLTX2Audio()
    model.load_state_dict(converted, strict=True)
    becomes = {int(v.flatten()[0]): k for k, v in converted.items()}
    assert len(becomes) == len(original) == len(expected)  # every original tensor used once
    pairing = {
        "file": "the audio VAE of Lightricks' LTX-2 single files (ltx-2-19b-dev.safetensors, ltx-2.3-*)",
        "model_code": "diffusers AutoencoderKLLTX2Audio at its defaults (the released config)",
        "pairing": "diffusers' convert_ltx2_audio_vae_to_diffusers (loaders/single_file_utils.py)",
        "keys": {k: {"shape": list(v.shape), "diffusers": becomes[int(v.flatten()[0])]} for k, v in original.items()},
    }
    (HERE / "ltx2audio-ltx-2.json").write_text(json.dumps(pairing, indent=1) + "\n")


if __name__ == "__main__":
    main()
