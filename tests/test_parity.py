"""Checkpoints saved by diffusers, converted through the CLI, loaded with `converter.load`, must encode and decode
like diffusers (fp32 max abs difference <= 1e-4) at several frame counts, with both targets: the Flax model
(jitted) and the torchax model (jitted under torchax). The causal frame cache and frame batching are where ports go
wrong; one-frame checks would not see it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import converter
from bench import diffusers_decode
from converter.models.common.protocol import encoded
from tests.helpers import (
    converted_by_cli,
    decode_inputs,
    family_cases,
    family_params,
    input_shape,
    run_cli,
    runner,
    small,
)

ATOL = 1e-4
# Every family's small configs, each under the first model name of its variant: the cases come from the registry.
CASES = family_cases(lambda testing: testing.small_configs)
ENCODER_CASES = {key: case for key, case in CASES.items() if "encoder" in case[0].parts}


@pytest.fixture(scope="module")
def converted(request, tmp_path_factory, default_arch):
    family, which, _ = CASES[request.param]
    if which == "default-arch":  # the session's conversion, which other modules read too
        shared = default_arch(family)
        reference, models = shared.reference, {t: converter.load(out) for t, out in shared.outputs.items()}
    else:
        name, config = small(family, which)
        reference, models = converted_by_cli(name, config, tmp_path_factory.mktemp(request.param))
    return family, reference, {target: runner(target, model) for target, model in models.items()}


@pytest.mark.parametrize("converted", family_params(CASES), indirect=True)
def test_decode_matches_diffusers(converted):
    family, reference, runners = converted
    channels = family.validation_latent_shape(family.config_class.from_dict(dict(reference.config)))[1]
    inputs, reference_inputs = decode_inputs(family, dict(reference.config))
    testing = family.testing()
    for frames, sizes in itertools.product(testing.parity_frames[0], testing.parity_latent_sizes):
        seed = torch.Generator().manual_seed(frames)
        z = torch.randn(input_shape(family, 1, channels, frames, sizes), generator=seed)
        with torch.no_grad():
            expected = diffusers_decode(reference, z, **reference_inputs).numpy()
        if family.clamps_output:
            # the output must not sit in the [-1, 1] clamp, or the comparison would prove nothing
            assert (np.abs(expected) < 0.99).mean() > 0.9
        for target, drive in runners.items():
            got = drive.decode(z.numpy(), **inputs)
            assert got.shape == expected.shape, (target, z.shape)
            assert np.abs(got - expected).max() <= ATOL, (target, z.shape, np.abs(got - expected).max())


@pytest.mark.parametrize("converted", family_params(ENCODER_CASES), indirect=True)
def test_encode_matches_diffusers(converted):
    family, reference, runners = converted
    channels = family.validation_sample_shape(family.config_class.from_dict(dict(reference.config)))[1]
    testing = family.testing()
    for frames, sizes in itertools.product(testing.parity_frames[1], testing.parity_video_sizes):
        shape = input_shape(family, 1, channels, frames, sizes)
        x = torch.rand(shape, generator=torch.Generator().manual_seed(frames)) * 2 - 1
        with torch.no_grad():
            expected_outputs = [a.numpy() for a in encoded(reference.encode(x))]
        for target, drive in runners.items():
            for got, expected in zip(drive.encode(x.numpy()), expected_outputs, strict=True):
                assert got.shape == expected.shape, (target, frames)
                assert np.abs(got - expected).max() <= ATOL, (target, frames, np.abs(got - expected).max())


def test_torchax_jitted_matches_plain_pytorch(wan_small, tmp_path):
    """The torchax model, each step jitted under torchax, against the same model in plain PyTorch."""
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = converter.load(tmp_path / "out").decode(z).sample.numpy()
    got = runner("torchax", converter.load(tmp_path / "out")).decode(z.numpy())
    assert np.abs(got - expected).max() <= ATOL
