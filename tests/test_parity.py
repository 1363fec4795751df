"""Checkpoints saved by diffusers, converted through the CLI, loaded with `converter.load`, must encode and decode
like diffusers (fp32 max abs difference <= 1e-4) at several frame counts, with both targets: the Flax model
(jitted) and the torchax model (jitted under torchax). The causal frame cache and frame batching are where ports go
wrong; one-frame checks would not see it.

Each input is a case of its own. The default architecture runs every frame count at every size; its longest input
(the largest frame count at the last size listed, the non-square or longer one: the first chunk and the cached ones)
is the fast tier's. The other configs change the structure, not the paths through the frames: they run the longest
input alone.

The torchax output is the project's PyTorch model, which torchax runs with each chunk step jitted: the chunk loop,
the cache and the layers are the model's own code, and the lowerings are the Flax model's functions (models/common).
Its jitted steps run at each config's longest input, where every layer of the config runs; the default
architecture's other inputs run the torchax output's model in plain PyTorch, where it takes the same paths through
the frames without tracing and compiling it again (over half of a case's time).

The models take each layer's convolution by the CPU's route for its shape, as users' CPU runs do, at each config's
longest input, where every layer of the config runs on the first chunk and the cached ones; at the default
architecture's other inputs, whose subject is the paths through the frames, they take XLA's own convolutions, which
compile faster (tests/conftest.py). test_conv.py proves each route against XLA's convolution."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
import torch

import converter
from bench import diffusers_decode
from converter.models.common.conv import XLA_CONV_ENV
from converter.models.common.protocol import encoded
from converter.runners import TorchRunner
from converter.targets import TARGETS
from tests.helpers import (
    converted_by_cli,
    decode_inputs,
    family_cases,
    family_param,
    input_shape,
    run_cli,
    runner,
    small,
)

ATOL = 1e-4
# Every family's small configs, each under the first model name of its variant: the cases come from the registry.
CASES = family_cases(lambda testing: testing.small_configs)
ENCODER_CASES = {key: case for key, case in CASES.items() if "encoder" in case[0].parts}


def _longest(family, part: int) -> tuple:
    """The (frames, sizes) of the family's longest decode (part 0) or encode (part 1) input."""
    testing = family.testing()
    return max(testing.parity_frames[part]), (testing.parity_latent_sizes, testing.parity_video_sizes)[part][-1]


def _is_longest(case: str, part: int, frames: int, sizes: tuple) -> bool:
    return (frames, sizes) == _longest(CASES[case][0], part)


def parity_inputs(cases: dict, part: int) -> list:
    """(case, frames, sizes) params of the decode's (part 0) or the encode's (part 1) inputs."""
    params = []
    for key, (family, which, _) in cases.items():
        testing = family.testing()
        sizes = (testing.parity_latent_sizes, testing.parity_video_sizes)[part]
        longest = _longest(family, part)
        every = itertools.product(testing.parity_frames[part], sizes) if which == "default-arch" else [longest]
        # the longest first: the steps it compiles with the CPU's routes serve the other inputs' same chunk shapes
        for frames, size in sorted(every, key=lambda input: input != longest):
            name = "x".join(map(str, (frames, *size) if family.frame_axis else size))
            slow = which != "default-arch" or (frames, size) != longest
            params.append(family_param(family, key, frames, size, slow=slow, id=f"{key}-{name}"))
    return params


# whether a step compiled with XLA's convolutions may be kept in this process: JAX's caches know a step by its model
# and shapes, not by the environment that chose its convolutions
_kept = {"xla_convolutions": False}


@pytest.fixture(autouse=True)
def convolutions(request):
    """The CPU's routes at a config's longest input, XLA's convolutions at the others (see the module's docstring).
    Before a longest input the steps compiled with XLA's are let go; after it, the others reuse its steps."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params else {}
    part = 1 if request.node.originalname == "test_encode_matches_diffusers" else 0
    routes = "case" in params and _is_longest(params["case"], part, params["frames"], params["sizes"])
    if routes and _kept["xla_convolutions"]:
        jax.clear_caches()
    _kept["xla_convolutions"] = not routes
    with pytest.MonkeyPatch.context() as patch:
        if routes:
            patch.delenv(XLA_CONV_ENV)
        yield


def _runners(runners: dict, case: str, part: int, frames: int, sizes: tuple) -> dict:
    """Every target's runner at the case's longest input; at the default architecture's others, Flax and the torchax
    output's PyTorch model in plain PyTorch (see the module's docstring)."""
    if _is_longest(case, part, frames, sizes):
        return {target: runners[target] for target in TARGETS}
    return {"flax": runners["flax"], "torch": runners["torch"]}


@pytest.fixture(scope="module")
def converted(tmp_path_factory, default_arch):
    """case -> (family, diffusers' model, {target, and "torch": runner}), converted once: a case's inputs are
    consecutive tests (one work unit, conftest.py), so only the last case is kept."""
    kept = {}

    def get(case):
        if case not in kept:
            kept.clear()
            family, which, _ = CASES[case]
            if which == "default-arch":  # the session's conversion, which other modules read too
                shared = default_arch(family)
                reference, models = shared.reference, {t: converter.load(out) for t, out in shared.outputs.items()}
            else:
                name, config = small(family, which)
                reference, models = converted_by_cli(name, config, tmp_path_factory.mktemp(case))
            runners = {target: runner(target, model) for target, model in models.items()}
            kept[case] = family, reference, {**runners, "torch": TorchRunner(models["torchax"])}
        return kept[case]

    return get


@pytest.mark.parametrize("case, frames, sizes", parity_inputs(CASES, 0))
def test_decode_matches_diffusers(converted, case, frames, sizes):
    family, reference, runners = converted(case)
    channels = family.validation_latent_shape(family.config_class.from_dict(dict(reference.config)))[1]
    inputs, reference_inputs = decode_inputs(family, dict(reference.config))
    seed = torch.Generator().manual_seed(frames)
    z = torch.randn(input_shape(family, 1, channels, frames, sizes), generator=seed)
    with torch.no_grad():
        expected = diffusers_decode(reference, z, **reference_inputs).numpy()
    if family.clamps_output:
        # the output must not sit in the [-1, 1] clamp, or the comparison would prove nothing
        assert (np.abs(expected) < 0.99).mean() > 0.9
    for target, drive in _runners(runners, case, 0, frames, sizes).items():
        got = drive.decode(z.numpy(), **inputs)
        assert got.shape == expected.shape, (target, z.shape)
        assert np.abs(got - expected).max() <= ATOL, (target, z.shape, np.abs(got - expected).max())


@pytest.mark.parametrize("case, frames, sizes", parity_inputs(ENCODER_CASES, 1))
def test_encode_matches_diffusers(converted, case, frames, sizes):
    family, reference, runners = converted(case)
    channels = family.validation_sample_shape(family.config_class.from_dict(dict(reference.config)))[1]
    x = torch.rand(input_shape(family, 1, channels, frames, sizes), generator=torch.Generator().manual_seed(frames))
    x = x * 2 - 1
    with torch.no_grad():
        expected_outputs = [a.numpy() for a in encoded(reference.encode(x))]
    for target, drive in _runners(runners, case, 1, frames, sizes).items():
        for got, expected in zip(drive.encode(x.numpy()), expected_outputs, strict=True):
            assert got.shape == expected.shape, (target, x.shape)
            assert np.abs(got - expected).max() <= ATOL, (target, x.shape, np.abs(got - expected).max())


def test_torchax_jitted_matches_plain_pytorch(wan_small, tmp_path):
    """The torchax model, each step jitted under torchax, against the same model in plain PyTorch."""
    source, _ = wan_small
    run_cli("wan2.1", "--source", source, "--to", "torchax", "--out", tmp_path / "out", "--no-validate")
    z = torch.randn(1, 4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = converter.load(tmp_path / "out").decode(z).sample.numpy()
    got = runner("torchax", converter.load(tmp_path / "out")).decode(z.numpy())
    assert np.abs(got - expected).max() <= ATOL
