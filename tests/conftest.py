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

# Small widths keep many frame counts affordable. Wan's default architecture has num_res_blocks=2, which gives the
# encoder 11 down_blocks entries, so list indices >= 10 occur (a converter that sorts keys as strings fails there).
WAN_SMALL = dict(base_dim=8, z_dim=4, latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
WAN_OTHER = dict(base_dim=8, decoder_base_dim=12, z_dim=8, dim_mult=[1, 2, 2], num_res_blocks=1,
                 temperal_downsample=[True, False], latents_mean=[0.0] * 8, latents_std=[1.0] * 8)
COG_SMALL = dict(block_out_channels=[16, 32, 32, 64], norm_num_groups=8, latent_channels=4)
COG_OTHER = dict(block_out_channels=[16, 32], down_block_types=["CogVideoXDownBlock3D"] * 2,
                 up_block_types=["CogVideoXUpBlock3D"] * 2, layers_per_block=1, latent_channels=3,
                 temporal_compression_ratio=2, norm_num_groups=4, use_quant_conv=True, use_post_quant_conv=True)


def run_cli(*args, check=True, cwd=REPO, **kwargs) -> subprocess.CompletedProcess:
    """Runs `vae-convert` as a user would, in a fresh process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "converter", *map(str, args)], capture_output=True, text=True,
                            cwd=cwd, env=env, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"vae-convert {' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def save_diffusers(class_name: str, path: Path, config: dict, seed: int = 0) -> torch.nn.Module:
    """A diffusers VAE with every parameter perturbed (norms and biases too, so a mapping that misplaces them shows),
    saved with diffusers' own `save_pretrained`."""
    import diffusers

    torch.manual_seed(seed)
    model = getattr(diffusers, class_name)(**config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=generator))
        if class_name == "AutoencoderKLWan":
            # keep decoded values inside Wan's [-1, 1] clamp, where a wrong value cannot hide behind saturation
            model.decoder.conv_out.weight.mul_(0.1)
    model.save_pretrained(path)
    return model


def converted_by_cli(model: str, diffusers_class: str, config: dict, root: Path, *cli_args) -> tuple:
    """A diffusers checkpoint saved under root/vae, converted to every target through the CLI and loaded back:
    (the diffusers model, {target: loaded model})."""
    import converter
    from converter.validate import RUNNERS

    reference = save_diffusers(diffusers_class, root / "vae", config)
    models = {}
    for target in RUNNERS:
        run_cli(model, "--source", root / "vae", "--to", target, "--out", root / target, *cli_args)
        models[target] = converter.load(root / target)
    return reference, models


@pytest.fixture(scope="session")
def wan_small(tmp_path_factory):
    path = tmp_path_factory.mktemp("wan_small") / "vae"
    return path, save_diffusers("AutoencoderKLWan", path, WAN_SMALL)


def edited_copy(source: Path, folder: Path, edit) -> Path:
    """A copy of a diffusers checkpoint folder whose state_dict went through `edit` (a function changing a dict)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    weights = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    edit(state)
    save_file(state, weights)
    return folder


def earlier_output(folder: Path, text: str = "previous output") -> Path:
    """A folder that passes for an earlier vae-convert output (its manifest is there), holding old.txt."""
    folder.mkdir(parents=True)
    (folder / "vae_convert.json").write_text(json.dumps({"tool": "vae-convert"}))
    (folder / "old.txt").write_text(text)
    return folder


def manifest(out: Path) -> dict:
    return json.loads((out / "vae_convert.json").read_text())
