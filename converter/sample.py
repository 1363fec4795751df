"""`vae-convert sample`: writes a diffusers-format checkpoint with random weights, for offline demos and tests.

It uses the project's PyTorch model (diffusers' names and layouts), so no Hub access and no diffusers install.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from converter.registry import ModelEntry
from converter.safetensors_io import SafetensorsWriter
from converter.sources import WEIGHTS_NAME

SMALL = {"wan2.1": {"base_dim": 16, "z_dim": 4, "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4},
         "cogvideox": {"block_out_channels": [16, 32, 32, 64], "norm_num_groups": 8, "latent_channels": 4}}


def write_sample(entry: ModelEntry, out: Path, small: bool, seed: int = 0) -> int:
    import torch

    family = entry.family
    config = family.config_from_dict({**entry.config, **(SMALL[family.name] if small else {})})
    torch.manual_seed(seed)
    state = family.load("torch_cls")(config).state_dict()
    out.mkdir(parents=True, exist_ok=False)
    writer = SafetensorsWriter(out / WEIGHTS_NAME, {k: (tuple(v.shape), np.dtype(np.float32)) for k, v in state.items()},
                               {"format": "pt"})
    for key, tensor in state.items():
        writer.write(key, tensor.numpy())
    writer.close()
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return sum(v.numel() for v in state.values())
