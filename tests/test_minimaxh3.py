"""MiniMax-H3's video VAE beyond the generic tests (which take its small configs, clip and chunk frame counts and tiling
case from models/minimaxh3/testing.py): tiling starts on with diffusers' tiles, as the model was released; a latent too
short for one chunk is one clear error; configs whose geometry diffusers' model cannot keep are refused, and one whose
decode runs a part-filled chunk decodes as diffusers'; MiniMax's original file (fused per-head q/k/v, swapped SwiGLU
halves) converts to what diffusers' conversion script makes of it, value for value, and so does ComfyUI's, with the
latents' statistics it keeps as tensors."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

import converter
from converter.registry import FAMILIES
from tests.helpers import PAIRINGS, fails, manifest, run_cli, run_in_process, runner

MINIMAXH3 = FAMILIES["minimaxh3"]


@pytest.fixture(scope="module")
def outputs(default_arch):
    shared = default_arch(MINIMAXH3)
    return shared.reference, {t: converter.load(out) for t, out in shared.outputs.items()}


def test_tiling_starts_with_diffusers_tiles(outputs):
    """diffusers' class starts tiled (test_registry checks ours do) with 256-pixel tiles overlapping by at least 64;
    ours start with the same settings, whose tiles test_tiling proves against diffusers' at small sizes (a decode
    larger than the released tiles takes minutes on CPU)."""
    reference, models = outputs
    for model in models.values():
        settings = dataclasses.asdict(model.tiling)
        assert settings and settings == {name: getattr(reference, name) for name in settings}


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_a_latent_shorter_than_a_chunk_is_one_clear_error(outputs, target):
    """diffusers' decode fails deep inside on fewer than 3 latent frames (a single image's one among them)."""
    _, models = outputs
    z = np.zeros((1, 24, 2, 2, 2), np.float32)
    with pytest.raises(ValueError, match="at least 3 latent frames"):
        runner(target, models[target]).decode(z)


def _with_config(default_arch, folder, **changes):
    """The default architecture's checkpoint, and a config.json of its config with `changes` that keep its weights."""
    converted = default_arch(MINIMAXH3)
    folder.mkdir()
    config = json.loads((converted.source / "config.json").read_text()) | changes
    (folder / "config.json").write_text(json.dumps(config))
    return converted.source, folder / "config.json"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        # diffusers' downsampler pads space only at a spatial stride of 2: at 1 its 3x3x3 convolution shrinks every
        # frame by 2 pixels, and latents would not map to pixels by the ratio
        (dict(spatial_downsample_factors=[1, 2]), "level 0 downsamples in time alone"),
        # diffusers' decode would slice chunks past the latent's end
        (dict(token_drop=10), "token_drop 10 is two clips' latent frames or more"),
    ],
)
def test_configs_whose_geometry_diffusers_cannot_keep_are_refused(default_arch, tmp_path, change, needle):
    source, config = _with_config(default_arch, tmp_path / "c", **change)
    fails(["minimax-h3", "--source", source, "--config", config, "--to", "flax", "--out", tmp_path / "o"], 3,
          needle, out=tmp_path / "o", in_process=True)  # fmt: skip


def test_a_token_drop_past_a_clip_converts_and_decodes_as_diffusers(default_arch, tmp_path):
    """token_drop 7 of a clip's 5 latent frames: diffusers' decode runs a part-filled last chunk, and an encode of one
    clip keeps no latent frame. The conversion validates (its video a clip longer), and decodes of several lengths
    equal diffusers'."""
    source, config = _with_config(default_arch, tmp_path / "c", token_drop=7)
    run_in_process("minimax-h3", "--source", source, "--config", config, "--to", "flax", "--out", tmp_path / "o",
                   "--no-preview", check=True)  # fmt: skip
    shapes = {check["output"]: check["shape"] for check in manifest(tmp_path / "o")["validation"]["checks"]}
    assert shapes["encode.mean"][2] > 0, shapes
    reference = default_arch(MINIMAXH3).reference
    dropping = type(reference)(**{k: v for k, v in reference.config.items() if k[0] != "_"} | {"token_drop": 7})
    dropping.load_state_dict(reference.state_dict())
    dropping.eval()
    drive = runner("flax", converter.load(tmp_path / "o"))
    for frames in (1, 4, 11):
        z = torch.randn(1, 24, frames, 2, 3, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            expected = dropping.decode(z).sample.numpy()
        got = drive.decode(z.numpy())
        assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-4, frames


def _original_file(folder, extra=None):
    """The seeded tensors make_minimaxh3_pairings.py converted with diffusers' script, written as MiniMax released
    them (with `extra` tensors beside), and a config.json of their small config."""
    folder.mkdir(exist_ok=True)
    small = json.loads((PAIRINGS / "minimaxh3-original.json").read_text())["small"]
    generator = torch.Generator().manual_seed(small["seed"])
    original = {key: torch.randn(shape, generator=generator) for key, shape in small["keys"]}
    save_file({**original, **(extra or {})}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLMiniMaxH3", **small["config"]}))
    return folder / "model.safetensors", folder / "config.json", small["diffusers_sha256"]


def _digests(out) -> dict:
    tensors = load_file(out / "diffusion_pytorch_model.safetensors")
    return {key: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for key, v in sorted(tensors.items())}


def test_the_original_file_converts_to_what_diffusers_script_makes_of_it(tmp_path):
    """The oracle is diffusers' scripts/convert_minimax_h3_to_diffusers.py: make_minimaxh3_pairings.py ran it on
    seeded random tensors of a small config and kept each diffusers tensor's digest; the same tensors, written as
    MiniMax released them, convert (and validate) to exactly those."""
    weights, config, expected = _original_file(tmp_path)
    out = tmp_path / "out"
    run_cli("minimax-h3", "--source", weights, "--config", config, "--to", "torchax", "--out", out)
    assert _digests(out) == expected


def test_comfyuis_file_converts_with_its_latents_statistics(tmp_path):
    """ComfyUI's file is the release's keys and the latents' statistics as float16 tensors: it converts to the
    release's tensors, its statistics where the config would be the named model's (the released values, which say
    what the file says at float16), and a config that says other statistics is refused (exit 3)."""
    # the released statistics (the pairings' small config keeps the released 24 latent channels)
    released = {k: np.asarray(v, np.float64) for k, v in MINIMAXH3.models[0].config.items()}
    statistics = {k: torch.from_numpy(v.astype(np.float16)) for k, v in released.items()}
    weights, config, expected = _original_file(tmp_path, statistics)
    out = tmp_path / "out"
    result = run_cli("minimax-h3", "--source", weights, "--config", config, "--to", "torchax", "--out", out)
    assert "minimax-h3-comfyui" in result.stdout + result.stderr
    assert _digests(out) == expected
    written = json.loads((out / "config.json").read_text())
    assert {k: written[k] for k in released} == {k: v.tolist() for k, v in released.items()}  # not float16's

    shifted = {k: torch.from_numpy((v + 0.5).astype(np.float16)) for k, v in released.items()}
    weights, config, _ = _original_file(tmp_path / "shifted", shifted)
    out = tmp_path / "shifted-out"
    run_in_process("minimax-h3", "--source", weights, "--config", config, "--to", "torchax", "--out", out,
                   "--no-validate", check=True)  # fmt: skip
    written = json.loads((out / "config.json").read_text())
    assert {k: written[k] for k in released} == {k: v.numpy().astype(np.float64).tolist() for k, v in shifted.items()}

    stated = json.loads(config.read_text()) | {k: v.tolist() for k, v in released.items()}
    config.write_text(json.dumps(stated))
    refused = run_cli("minimax-h3", "--source", weights, "--config", config, "--to", "torchax", "--out",
                      tmp_path / "refused", check=False)  # fmt: skip
    assert refused.returncode == 3 and "the config and the weights are of two models" in refused.stderr
    assert not (tmp_path / "refused").exists()


def test_a_bfloat16_output_keeps_diffusers_float32_modules(default_arch, tmp_path):
    """`--dtype bfloat16` keeps the encoder, quant_conv, the norms and the layer scales float32, as diffusers'
    `_keep_in_fp32_modules` does (the ViT's projections bfloat16), validates, and runs as diffusers' bfloat16 model
    runs: the encode in float32 (to float32's rounding of diffusers' own), the decode with its norms and scales in
    float32 (no further from diffusers' float32 decode than diffusers' bfloat16 is, within a small margin)."""
    from converter.models.minimaxh3.spec import MINIMAXH3 as spec

    converted = default_arch(MINIMAXH3)
    reference = converted.reference
    low = type(reference).from_pretrained(converted.source, torch_dtype=torch.bfloat16).eval()
    x = torch.rand(1, 3, 17, 12, 20, generator=torch.Generator().manual_seed(0)) * 2 - 1
    z = torch.randn(1, reference.config.latent_channels, 7, 3, 5, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected_mean = low.encode(x.bfloat16()).latent_dist.mean.float().numpy()
        exact = reference.decode(z).sample.numpy()
        diffusers_error = np.abs(low.decode(z.bfloat16()).sample.float().numpy() - exact).max()
    for target in ("flax", "torchax"):
        out = tmp_path / target
        run_cli(converted.name, "--source", converted.source, "--to", target, "--dtype", "bfloat16", "--out", out)
        vae = converter.load(out)
        if target == "flax":
            from flax import nnx

            dtypes = {".".join(map(str, p)): v.dtype for p, v in nnx.to_flat_state(nnx.state(vae))}
        else:
            dtypes = {k: v.dtype for k, v in vae.state_dict().items()}
        kept = {k for k in dtypes if set(spec.keep_in_float32) & set(k.split("."))}
        assert kept and all(np.dtype(str(dtypes[k]).removeprefix("torch.")) == np.float32 for k in kept), target
        assert {str(dtypes[k]).removeprefix("torch.") for k in set(dtypes) - kept} == {"bfloat16"}, target
        drive = converter.targets.TARGETS[target].runner(vae, native=True)
        mean = np.asarray(drive.encode(x.numpy())[0], np.float32)
        assert np.abs(mean - expected_mean).max() <= 1e-4, target
        error = np.abs(np.asarray(drive.decode(z.numpy()), np.float32) - exact).max()
        assert error <= 1.5 * diffusers_error, (target, error, diffusers_error)
