"""LTX-Video's VAE beyond the generic tests (which take its small configs, frame counts, tiling, mesh and export
cases from models/ltx/testing.py): 0.9.1's noise injection fed diffusers' own draws, the timestep at two values and
per batch entry, a non-square size, diffusers' framewise temporal tiles, the latent
statistics carried by both targets and recorded in the manifest, diffusers reading the torchax output, an encoder
diffusers cannot run refused, and Lightricks' single files of each layout, their config taken from their metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.loaders.single_file_utils import convert_ltx2_vae_to_diffusers, convert_ltx_vae_checkpoint_to_diffusers
from safetensors.torch import load_file, save_file

from converter.models.ltx.config import LTX2_20_CONFIG, LTX2_23_CONFIG, LTX_091_CONFIG, LTX_095_CONFIG
from converter.models.ltx.original import LTX2_ORIGINAL_CONFIGS, ORIGINAL_CONFIGS, ltx2_config, ltx_video_config
from converter.models.ltx.testing import LTX_091_SMALL
from converter.registry import FAMILIES
from tests.helpers import REPO, converted_by_cli, fails, manifest, run_cli, runner, save_diffusers, small
from tests.original_files import assert_same_tensors, output_tensors

ATOL = 1e-4
LTX = FAMILIES["ltx"]
LTX2 = FAMILIES["ltx2"]
PAIRINGS = REPO / "tests" / "data" / "source-formats"


@pytest.fixture(scope="module")
def ltx_095(tmp_path_factory):
    name, config = small(LTX, "ltx-0.9.5")
    root = tmp_path_factory.mktemp("ltx-0.9.5")
    return (*converted_by_cli(name, config, root), root)


@pytest.fixture(scope="module")
def ltx_091(tmp_path_factory):
    return converted_by_cli("ltx-video-0.9.1", LTX_091_SMALL, tmp_path_factory.mktemp("ltx-0.9.1"))


def _compare(expected, models, run_ours):
    for target, model in models.items():
        got = run_ours(runner(target, model))
        assert got.shape == expected.shape, target
        assert np.abs(got - expected).max() <= ATOL, (target, np.abs(got - expected).max())


def _latent(frames, height, width, seed=0, batch=1):
    return torch.randn(batch, 8, frames, height, width, generator=torch.Generator().manual_seed(seed))


def _decode_capturing_noise(reference, z, temb, monkeypatch) -> tuple[np.ndarray, list[np.ndarray]]:
    """diffusers' decode and the noise maps it drew from torch's global generator, in order."""
    draws, draw = [], torch.randn

    def recording(*args, **kwargs):
        out = draw(*args, **kwargs)
        draws.append(out.numpy().copy())
        return out

    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(torch, "randn", recording)
        decoded = reference.decode(z, temb=torch.tensor(temb)).sample.numpy()
    return decoded, draws


def test_noise_injection_adds_diffusers_draws_as_diffusers_does(ltx_091, monkeypatch):
    reference, models = ltx_091
    z, temb = _latent(2, 2, 3), [0.3]
    expected, draws = _decode_capturing_noise(reference, z, temb, monkeypatch)
    assert [d.shape for d in draws] == LTX.config_class.from_dict(LTX_091_SMALL).noise_map_sizes(2, 3)
    _compare(expected, models, lambda r: r.decode(z.numpy(), temb=np.float32(temb), noise=draws))
    # the noise counts: without it the output moves
    quiet = [np.zeros_like(d) for d in draws]
    assert (
        np.abs(runner("flax", models["flax"]).decode(z.numpy(), temb=np.float32(temb), noise=quiet) - expected).max()
        > 100 * ATOL
    )
    # by default the PyTorch model draws from torch's global generator as diffusers does: the same maps after the
    # same seed
    torch.manual_seed(7)
    with torch.no_grad():
        expected = reference.decode(z, temb=torch.tensor(temb)).sample.numpy()
    torch.manual_seed(7)
    with torch.no_grad():
        got = models["torchax"].decode(z, temb=torch.tensor(temb)).sample.numpy()
    assert np.abs(got - expected).max() <= ATOL


@pytest.mark.slow
def test_noise_sources(ltx_091):
    """A seed draws the same maps on every target; a JAX key or a torch generator draws reproducibly; maps of the
    wrong shapes are refused."""
    _, models = ltx_091
    z = _latent(2, 2, 2).numpy()
    flax, torchax = runner("flax", models["flax"]), runner("torchax", models["torchax"])
    by_seed = flax.decode(z, temb=np.float32([0.1]), noise=np.array(3))
    assert np.abs(torchax.decode(z, temb=np.float32([0.1]), noise=np.array(3)) - by_seed).max() <= ATOL
    assert np.abs(flax.decode(z, temb=np.float32([0.1]), noise=np.array(4)) - by_seed).max() > 100 * ATOL

    import jax

    vae = models["flax"]
    key = jax.random.key(0)
    channels_last = z.transpose(0, 2, 3, 4, 1)
    np.testing.assert_array_equal(
        np.asarray(vae.decode(channels_last, temb=0.1, noise=key)),
        np.asarray(vae.decode(channels_last, temb=0.1, noise=key)),
    )
    with torch.no_grad():
        first = models["torchax"].decode(torch.from_numpy(z), temb=0.1, noise=torch.Generator().manual_seed(1)).sample
        again = models["torchax"].decode(torch.from_numpy(z), temb=0.1, noise=torch.Generator().manual_seed(1)).sample
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    with pytest.raises(ValueError, match="noise: expected maps of shapes"):
        vae.decode(channels_last, temb=0.1, noise=[np.zeros((2, 2), np.float32)])


@pytest.mark.slow
def test_timestep_conditioning_at_two_timesteps_and_per_batch_entry(ltx_095):
    reference, models, _ = ltx_095
    z = _latent(2, 2, 3)
    outputs = []
    for temb in ([0.05], [0.8]):
        with torch.no_grad():
            expected = reference.decode(z, temb=torch.tensor(temb)).sample.numpy()
        _compare(expected, models, lambda r, t=temb: r.decode(z.numpy(), temb=np.float32(t)))
        outputs.append(expected)
    assert np.abs(outputs[0] - outputs[1]).max() > 100 * ATOL  # the timestep is used
    # a timestep per batch entry
    zz = torch.cat([z, _latent(2, 2, 3, seed=1)])
    with torch.no_grad():
        expected = reference.decode(zz, temb=torch.tensor([0.05, 0.8])).sample.numpy()
    _compare(expected, models, lambda r: r.decode(zz.numpy(), temb=np.float32([0.05, 0.8])))
    with pytest.raises(ValueError, match="timestep-conditioned; pass temb"):
        models["flax"].decode(z.numpy().transpose(0, 2, 3, 4, 1))


@pytest.mark.slow
def test_non_square_decode_and_encode(ltx_095):
    reference, models, _ = ltx_095
    z = _latent(3, 2, 5, seed=2)
    with torch.no_grad():
        expected = reference.decode(z, temb=torch.tensor([0.05])).sample.numpy()
    _compare(expected, models, lambda r: r.decode(z.numpy(), temb=np.float32([0.05])))
    x = torch.rand(1, 3, 9, 64, 160, generator=torch.Generator().manual_seed(3)) * 2 - 1
    with torch.no_grad():
        expected = reference.encode(x).latent_dist.mean.numpy()
    _compare(expected, models, lambda r: r.encode(x.numpy())[0])


def _framewise(models, reference, on: bool):
    for vae in (*models.values(), reference):
        vae.use_framewise_decoding = on


@pytest.mark.slow
def test_framewise_temporal_tiles(ltx_095):
    """diffusers' overlapping temporal tiles: decode drops each later tile's last frame, encode its first latent;
    encode follows the decoding switch, as diffusers' _encode reads it. (Spatial tiles inside them are the spatial
    tiling's own code, which tests/test_tiling.py compares; each tile shape is a compile, so not here too.)"""
    reference, models, _ = ltx_095
    z = _latent(4, 2, 2, seed=4)
    x = torch.rand(1, 3, 25, 64, 64, generator=torch.Generator().manual_seed(5)) * 2 - 1
    with torch.no_grad():
        whole = reference.decode(z, temb=torch.tensor([0.05])).sample.numpy()
    _framewise(models, reference, True)
    try:
        with torch.no_grad():
            decoded = reference.decode(z, temb=torch.tensor([0.05])).sample.numpy()
            encoded = reference.encode(x).latent_dist.mean.numpy()
        assert np.abs(decoded - whole).max() > 100 * ATOL  # the tiles change the result: the test proves them
        _compare(decoded, models, lambda r: r.decode(z.numpy(), temb=np.float32([0.05])))
        _compare(encoded, models, lambda r: r.encode(x.numpy())[0])
    finally:
        _framewise(models, reference, False)


def test_latent_statistics_are_carried_and_recorded(ltx_095):
    reference, models, root = ltx_095
    for name in ("latents_mean", "latents_std"):
        expected = getattr(reference, name).numpy()
        np.testing.assert_array_equal(np.asarray(getattr(models["flax"], name)[...]), expected)
        np.testing.assert_array_equal(getattr(models["torchax"], name).numpy(), expected)
        for target in models:
            np.testing.assert_array_equal(np.float32(manifest(root / target)["tensors"][name]), expected)


# -- Lightricks' single files ----------------------------------------------------------------------------------

# layout -> (family, model name, its published metadata VAE config, its translation to the diffusers config)
LAYOUTS = {
    **{layout: (LTX, "ltx-video", config, ltx_video_config) for layout, config in ORIGINAL_CONFIGS.items()},
    **{layout: (LTX2, "ltx-2", config, ltx2_config) for layout, config in LTX2_ORIGINAL_CONFIGS.items()},
}
# the layouts whose Flax conversion runs, validated (the others' renaming is proven on the torchax output, which has
# diffusers' names; both targets read the same renamed tensors): a noise-injecting conditioned decoder, and LTX-2.3's
# mixed upsamplers
FLAX_LAYOUTS = ("0.9.1", "2.3")


def _small_original(layout: str) -> dict:
    """The layout's metadata VAE config (its block lists as released) at small widths."""
    return {
        **LAYOUTS[layout][2],
        "latent_channels": 8,
        "encoder_base_channels": 8,
        "decoder_base_channels": 8,
    }


def _single_file(layout: str, state: dict, path: Path, vae_config: dict | None) -> Path:
    """A Lightricks single file: the diffusers state_dict renamed by the layout's pairings under `vae.`, the
    statistics diffusers drops, other models' tensors (LTX-2's audio VAE), and the config in the metadata."""
    keys = json.loads((PAIRINGS / f"ltx-{layout}.json").read_text())["keys"]
    tensors = {original: state[entry["diffusers"]].clone().contiguous() for original, entry in keys.items()}
    channels = state["latents_mean"].shape[0]
    tensors["vae.per_channel_statistics.channel"] = torch.arange(channels, dtype=torch.float32)
    tensors["vae.per_channel_statistics.mean-of-stds"] = torch.ones(channels)
    tensors["model.diffusion_model.patchify_proj.weight"] = torch.ones(4, 4)
    if LAYOUTS[layout][0] is LTX2:
        tensors["audio_vae.per_channel_statistics.mean-of-means"] = torch.zeros(channels)
    metadata = {} if vae_config is None else {"config": json.dumps({"vae": vae_config, "transformer": {}})}
    save_file(tensors, path, metadata=metadata)
    return path


def test_an_encoder_block_that_keeps_its_width_before_a_wider_one_is_refused(tmp_path):
    """0.9.5's and LTX-2's encoder blocks change width in their space-to-depth downsampler alone: where a level has
    none, diffusers' encode fails on the next block's convolution; ours is refused before anything is written."""
    name, config = small(LTX, "ltx-0.9.5")
    config = {**config, "spatio_temporal_scaling": [False, True, True, True]}
    reference = save_diffusers(LTX, tmp_path / "vae", config)
    with pytest.raises(RuntimeError, match="channels"), torch.no_grad():
        reference.encode(torch.zeros(1, 3, 9, 64, 64))
    needle = "an encoder block of 8 channels with no space-to-depth downsampler"
    fails([name, "--source", tmp_path / "vae", "--to", "flax", "--out", tmp_path / "o"], 3, needle, out=tmp_path / "o",
          in_process=True)  # fmt: skip


def test_metadata_configs_translate_to_diffusers_configs():
    """The published layouts' metadata configs become the diffusers configs of those versions (the keys and shapes
    of Lightricks' model built from each equal diffusers' built from the translation: make_ltx_pairings.py)."""
    published = {
        "0.9.0": {},
        "0.9.1": LTX_091_CONFIG,
        "0.9.5": LTX_095_CONFIG,
        "2.0": LTX2_20_CONFIG,
        "2.3": LTX2_23_CONFIG,
    }
    for layout, expected in published.items():
        family, _, original, translate = LAYOUTS[layout]
        assert family.config_class.from_dict(translate(original)) == family.config_class.from_dict(expected), layout


@pytest.mark.parametrize(
    "layout", [pytest.param(layout, marks=[pytest.mark.slow] * (i > 0)) for i, layout in enumerate(LAYOUTS)]
)
def test_single_file_converts_to_the_diffusers_checkpoint_s_tensors(layout, tmp_path):
    """A single file of each layout converts, with the config its metadata carries, to exactly the tensors and config
    of the diffusers checkpoint it holds; diffusers' own converter makes that checkpoint from the file (where its
    layout test can tell: 0.9.0 and 0.9.1 (0.9.5's is a width of 2048); LTX-2.0 (its table stops before 2.3's fourth
    decoder level))."""
    family, name, _, translate = LAYOUTS[layout]
    config = translate(_small_original(layout))
    reference = save_diffusers(family, tmp_path / "vae", config)
    state = reference.state_dict()
    original = _single_file(layout, state, tmp_path / f"ltx-{layout}.safetensors", _small_original(layout))
    diffusers_converter = {
        "0.9.0": convert_ltx_vae_checkpoint_to_diffusers,
        "0.9.1": convert_ltx_vae_checkpoint_to_diffusers,
        "2.0": convert_ltx2_vae_to_diffusers,
    }
    if layout in diffusers_converter:
        vae_tensors = {k: v for k, v in load_file(original).items() if k.startswith("vae.")}
        converted = diffusers_converter[layout](vae_tensors)
        assert converted.keys() == state.keys()
        for key, value in state.items():
            assert torch.equal(converted[key], value), key
    targets = ("torchax", "flax") if layout in FLAX_LAYOUTS else ("torchax",)
    for target in targets:
        validate = () if target == "flax" else ("--no-validate",)
        result = run_cli(name, "--source", original, "--to", target, "--out", tmp_path / target, *validate)
        assert f"source format: {'ltx-2' if family is LTX2 else f'ltx-{layout}'}" in result.stderr
        assert "config from the file's metadata; dropped" in result.stderr
        written = json.loads((tmp_path / target / "config.json").read_text())
        assert family.config_class.from_dict(written) == family.config_class.from_dict(config)
    expected = {k: v.numpy() for k, v in state.items()}
    assert_same_tensors(output_tensors(tmp_path / "torchax"), expected)
    if "flax" in targets:
        assert manifest(tmp_path / "flax")["validation"]["ok"]


def test_single_file_with_a_broken_metadata_config_or_of_the_other_generation_is_refused(tmp_path):
    config = ltx_video_config(_small_original("0.9.0"))
    state = save_diffusers(LTX, tmp_path / "vae", config).state_dict()
    broken = _single_file("0.9.0", state, tmp_path / "broken.safetensors", None)
    save_file(load_file(broken), broken, metadata={"config": "{not json"})
    fails(
        ["ltx-video", "--source", broken, "--to", "flax", "--out", tmp_path / "out"],
        3,
        "metadata config is not a JSON object",
        out=tmp_path / "out",
    )
    odd = {**_small_original("0.9.0"), "norm_layer": "group_norm"}
    _single_file("0.9.0", state, tmp_path / "odd.safetensors", odd)
    fails(
        ["ltx-video", "--source", tmp_path / "odd.safetensors", "--to", "flax", "--out", tmp_path / "out"],
        3,
        "norm_layer 'group_norm'",
        out=tmp_path / "out",
    )
    ltx2_state = save_diffusers(LTX2, tmp_path / "vae2", ltx2_config(_small_original("2.0"))).state_dict()
    ltx2_file = _single_file("2.0", ltx2_state, tmp_path / "ltx-2.safetensors", _small_original("2.0"))
    fails(
        ["ltx-video", "--source", ltx2_file, "--to", "flax", "--out", tmp_path / "out"],
        3,
        "try `vae-convert ltx-2`",
        out=tmp_path / "out",
    )
    # a key of 0.9.5's signature too: the formats it fits are each named with their own family
    with_timestep = {
        **load_file(ltx2_file),
        "vae.decoder.last_time_embedder.timestep_embedder.linear_1.weight": torch.ones(1),
    }
    save_file(
        with_timestep, tmp_path / "both.safetensors", metadata={"config": json.dumps({"vae": _small_original("2.0")})}
    )
    fails(
        ["ltx-2", "--source", tmp_path / "both.safetensors", "--to", "flax", "--out", tmp_path / "out"],
        3,
        "ltx-0.9.5 (ltx), ltx-2 (ltx2)",
        out=tmp_path / "out",
    )


def test_a_single_file_no_format_fits_is_refused_naming_the_layout_nearest_it(tmp_path):
    """A file of LTX-Video's keys that no format fits (0.9.0's, its last decoder level numbered one further and a
    timestep scale beside it, as no release has them) is named after the layout whose rules keep the most of its
    keys, with what it lacks; not after LTX-2's audio VAE format, which drops every key but its own and so knows
    them all."""
    state = save_diffusers(LTX, tmp_path / "vae", ltx_video_config(_small_original("0.9.0"))).state_dict()
    whole = load_file(_single_file("0.9.0", state, tmp_path / "whole.safetensors", _small_original("0.9.0")))
    cut = {k.replace("vae.decoder.up_blocks.9.", "vae.decoder.up_blocks.10."): v for k, v in whole.items()}
    cut["vae.decoder.timestep_scale_multiplier"] = torch.tensor(1000.0)
    save_file(cut, tmp_path / "cut.safetensors", metadata={"config": json.dumps({"vae": _small_original("0.9.0")})})
    args = ["ltx-video", "--source", tmp_path / "cut.safetensors", "--to", "torchax", "--out", tmp_path / "out"]
    needle = "closest: ltx-0.9.0 of ltx"
    unknown = "keys it does not know: 'vae.decoder.timestep_scale_multiplier'"
    fails(args, 3, needle, unknown, "'vae.decoder.up_blocks.9.", out=tmp_path / "out", in_process=True)


def _with_metadata_config(source: Path, path: Path, value) -> Path:
    """`source` with its metadata's `config` set to `value` (any JSON value: the safetensors library itself writes
    strings only, so the header is written here)."""
    data = source.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header["__metadata__"]["config"] = value
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[8 + size :])
    return path


def test_a_metadata_config_of_odd_values_is_refused_by_field(tmp_path):
    """Values the translation computes with are checked before it does: a zero factor would divide, a string width
    would be repeated, a config that is not JSON text would be parsed as something else; sizes are bounded (a layer
    count of 10**8 would be built without end, a width of 2**40 overflows). Each: exit 3, one line naming the field,
    nothing left."""
    original = _small_original("0.9.5")
    state = save_diffusers(LTX, tmp_path / "vae", ltx_video_config(original)).state_dict()
    good = _single_file("0.9.5", state, tmp_path / "good.safetensors", original)

    def decoder_block(i, params):
        blocks = [list(b) for b in original["decoder_blocks"]]
        blocks[i] = [blocks[i][0], params]
        return {**original, "decoder_blocks": blocks}

    cases = {
        "object": (_with_metadata_config(good, tmp_path / "object.safetensors", {"vae": original}), "is an object"),
        "number": (_with_metadata_config(good, tmp_path / "number.safetensors", 5), "is a number, not a string"),
        "zero-multiplier": (decoder_block(1, {"residual": True, "multiplier": 0}), "multiplier 0"),
        "string-width": ({**original, "decoder_base_channels": "x"}, "decoder_base_channels 'x'"),
        "string-layers": (decoder_block(0, {"num_layers": "5"}), "num_layers '5'"),
        "layers-without-end": (decoder_block(0, {"num_layers": 10**8}), "layers_per_block"),
        "width-past-overflow": ({**original, "decoder_base_channels": 2**40}, "block_out_channels"),
    }
    for name, (config, needle) in cases.items():
        source = (
            config
            if isinstance(config, Path)
            else _single_file("0.9.5", state, tmp_path / f"{name}.safetensors", config)
        )
        out = tmp_path / f"out-{name}"
        fails(["ltx-video", "--source", source, "--to", "torchax", "--out", out], 3, needle, out=out, in_process=True)
    evil = {**_small_original("2.0"), "_class_name": "Evil\nsecond line"}
    ltx2_state = save_diffusers(LTX2, tmp_path / "vae2", ltx2_config(_small_original("2.0"))).state_dict()
    source = _single_file("2.0", ltx2_state, tmp_path / "evil.safetensors", evil)
    fails(["ltx-2", "--source", source, "--to", "torchax", "--out", tmp_path / "o"], 3, r"'Evil\nsecond line'")
