"""Shared fixtures: checkpoints built and saved by diffusers (the independent oracle), and the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

# Small widths keep many frame counts affordable; num_res_blocks=2 gives the encoder 11 down_blocks entries, so
# list indices >= 10 occur (a converter that sorts keys as strings puts "10" before "2" and fails here).
WAN_SMALL = dict(base_dim=8, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
WAN_OTHER = dict(base_dim=8, decoder_base_dim=12, z_dim=8, dim_mult=[1, 2, 2], num_res_blocks=1,
                 temperal_downsample=[True, False], latents_mean=[0.0] * 8, latents_std=[1.0] * 8)


def run_cli(*args, check=True, **kwargs) -> subprocess.CompletedProcess:
    """Runs `vae-convert` as a user would, in a fresh process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "converter", *map(str, args)], capture_output=True, text=True,
                            cwd=REPO, env=env, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"vae-convert {' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def randomize(model: torch.nn.Module, seed: int = 0):
    """Perturbs every parameter (gammas and biases too, so a mapping that misplaces them shows), and scales the
    decoder's last conv so decoded values stay inside diffusers' [-1, 1] clamp instead of saturating."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
        model.decoder.conv_out.weight.mul_(0.1)
    return model


def save_diffusers_wan(path: Path, config: dict, seed: int = 0):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    model = randomize(AutoencoderKLWan(**config).eval(), seed)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def wan_small(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan_small") / "vae"
    return path, save_diffusers_wan(path, WAN_SMALL)


@pytest.fixture(scope="session")
def wan_other(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan_other") / "vae"
    return path, save_diffusers_wan(path, WAN_OTHER, seed=1)


def manifest(out: Path) -> dict:
    return json.loads((out / "vae_convert.json").read_text())
