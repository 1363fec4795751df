"""A validation that compares nothing never passes, and a model is validated as it will run: a deliberately wrong
mapping fails beside a huge and beside an infinite reference value (the infinite one is said to be uncomparable);
a float16 output whose activations overflow fails, in both targets, unless its config upcasts it, as diffusers'
pipelines do; the reference's own rounding past the tolerance is measured again, not failed; the manifest stays
standard JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import converter
from converter.errors import ValidationError
from converter.mapping import MAPPINGS_DIR
from converter.registry import FAMILIES
from tests.helpers import edited_copy, fails, manifest, run_cli, run_in_process, save_diffusers, small

KL = FAMILIES["autoencoderkl"]


@pytest.fixture(scope="module")
def sd(tmp_path_factory):
    """A small SD-layout checkpoint (quant convs, 4 latent channels) saved by diffusers."""
    folder = tmp_path_factory.mktemp("sd") / "vae"
    save_diffusers(KL, folder, small(KL, "default-arch")[1])
    return folder


def _wrong_mapping(folder) -> str:
    """The family's mapping with quant_conv's kernel transposed wrongly for Flax (the mistake validation exists to
    catch): its 8x8 matrix read as its own transpose."""
    text = (MAPPINGS_DIR / "autoencoderkl.yaml").read_text()
    text = text.replace("|conv|quant_conv|post_quant_conv'", "|conv|post_quant_conv'")
    text = text.replace(
        "    - name: attention-kernel\n",
        "    - name: quant-conv-kernel-wrong\n      match: 'quant_conv\\.weight'\n      to: 'quant_conv.kernel'\n"
        "      transpose: [2, 3, 0, 1]\n\n    - name: attention-kernel\n",
        1,
    )
    text = text.replace(
        "      to: '{1}.bias'\n\n    - name: group-norm-weight",
        "      to: '{1}.bias'\n\n    - name: quant-conv-bias\n      match: 'quant_conv\\.bias'\n"
        "      to: 'quant_conv.bias'\n\n    - name: group-norm-weight",
        1,
    )
    path = folder / "wrong.yaml"
    path.write_text(text)
    return path


def _huge_first_channel(value: float):
    """An edit making encode.mean's channel 0 `value` times a constant, its logvar rows symmetric (so the wrong
    transpose leaves logvar as it is and wrongs the mean's other channels only)."""

    def edit(state):
        w, b = state["encoder.conv_out.weight"].clone(), state["encoder.conv_out.bias"].clone()
        w[0], w[1], b[0], b[1] = 0, 0, 0, 10.0
        state["encoder.conv_out.weight"], state["encoder.conv_out.bias"] = w, b
        q = torch.randn(8, 8, generator=torch.Generator().manual_seed(1)) * 0.5
        q[4:, :] = q[:, 4:].T
        q[0, 1] = value
        state["quant_conv.weight"] = q[:, :, None, None].contiguous()

    return edit


@pytest.mark.parametrize(
    ("value", "needle"), [(1e29, "validation failed for encode.mean"), (1e38, "is not finite (NaN or Inf)")]
)
def test_a_wrong_mapping_fails_beside_a_huge_or_infinite_reference_value(sd, tmp_path, value, needle):
    """1e29: finite, a channel thirty orders above the others, whose tolerance once loosened them all; 1e38: the
    reference overflows to Inf, where a comparison once passed anything."""
    source = edited_copy(sd, tmp_path / "crafted", _huge_first_channel(value))
    wrong = _wrong_mapping(tmp_path)
    out = tmp_path / "out"
    args = ["sd1.5", "--source", source, "--to", "flax", "--out", out, "--no-preview"]
    fails([*args, "--mapping", wrong], ValidationError.exit_code, needle, out=out)
    if value < 1e38:  # the family's own mapping on the same file validates
        run_cli(*args)
        assert manifest(out)["validation"]["ok"]
        json.loads((out / "vae_convert.json").read_text(), parse_constant=lambda c: pytest.fail(c))


def test_a_reference_rounding_past_the_tolerance_is_measured_again_and_a_wrong_mapping_still_fails(
    sd, tmp_path, monkeypatch
):
    """PyTorch's oneDNN convolutions round a deep model's float32 output past the tolerance on some machines
    (CogVideoX-2b's full-size encoder on one thread, test_full_size.py); here every convolution of the reference is
    off by 1e-3 of its value while oneDNN is on. The conversion validates against PyTorch's own convolutions and
    says so; a wrong mapping measured the same way still fails."""
    conv2d = torch.nn.functional.conv2d

    def rounded_as_far(*args, **kwargs):
        out = conv2d(*args, **kwargs)
        return out * (1 + 1e-3) if torch.backends.mkldnn.enabled else out

    monkeypatch.setattr(torch.nn.functional, "conv2d", rounded_as_far)
    args = ["sd1.5", "--source", sd, "--to", "flax", "--no-preview"]
    result = run_in_process(*args, "--out", tmp_path / "out", check=True)
    assert "decode and encode: beyond the tolerance at first, measured again" in result.stderr
    assert manifest(tmp_path / "out")["validation"]["measured_again"] == ["decode", "encode"]
    wrong = run_in_process(*args, "--out", tmp_path / "wrong", "--mapping", _wrong_mapping(tmp_path))
    assert wrong.returncode == ValidationError.exit_code and "measured again" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "wrong").exists()


@pytest.mark.parametrize("target", ["flax", "torchax"])
def test_a_float16_output_whose_activations_overflow_fails_unless_its_config_upcasts_it(sd, tmp_path, target):
    """Weights that fit float16 whose activations do not (SDXL's VAE is the real case): with force_upcast off the
    float16 output runs in float16 and decodes to NaN, so validation fails and says what to do; with it on (as
    SDXL's config has it), the output loads in float32, as diffusers' pipelines run such a VAE, and validates."""

    def overflow(state):
        state["decoder.conv_in.weight"] = state["decoder.conv_in.weight"] * 60000

    source = edited_copy(sd, tmp_path / "ovf", overflow)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "force_upcast": False}))
    out = tmp_path / "out"
    args = ["sd1.5", "--source", source, "--to", target, "--dtype", "float16", "--out", out, "--no-preview"]
    fails(args, ValidationError.exit_code, "NaN or Inf when the model runs in float16", "--dtype float32", out=out)
    (source / "config.json").write_text(json.dumps({**config, "force_upcast": True}))
    run_cli(*args)
    checks = manifest(out)["validation"]["checks"]
    assert manifest(out)["validation"]["ok"] and {"decode (float32)", "encode.mean (float32)"} <= {
        c["output"] for c in checks
    }
    z = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    vae = converter.load(out)
    with torch.no_grad():
        decoded = vae.decode(np.moveaxis(z, 1, -1)) if target == "flax" else vae.decode(torch.from_numpy(z)).sample
    assert np.isfinite(np.asarray(decoded)).all()
