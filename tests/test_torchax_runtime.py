"""The torchax runtime: placeholders exactly for the named-tensor overloads torch 2.13 lacks (torchax 0.0.13), and
convolutions lowered as the Flax models lower them."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.helpers import REPO

PROBE = """
import json
from converter import torchax_runtime as rt
before = rt.missing_overloads()
torchax = rt.import_torchax()
print(json.dumps({"before": before, "after": rt.missing_overloads(), "version": torchax.__version__}))
"""


def test_torchax_imports_with_placeholders_for_exactly_the_missing_overloads():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True)
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["after"] == []  # every name torchax needs now resolves
    # the placeholders were added only for names this torch really lacks
    from converter.torchax_runtime import REMOVED_NAMED_OVERLOADS

    assert set(probe["before"]) <= set(REMOVED_NAMED_OVERLOADS)
    for name in set(REMOVED_NAMED_OVERLOADS) - set(probe["before"]):
        op, overload = name.split(".")
        getattr(getattr(torch.ops.aten, op), overload)


@pytest.mark.parametrize(
    "conv, shape, taps",
    [
        (lambda: torch.nn.Conv3d(8, 6, 3, padding=(0, 1, 1)), (2, 8, 5, 7, 9), 3),  # causal convs: time unpadded
        (lambda: torch.nn.Conv3d(8, 6, (3, 1, 1), stride=(2, 1, 1)), (1, 8, 5, 4, 4), 0),  # Wan's time downsampling
        (lambda: torch.nn.Conv3d(8, 6, 1), (1, 8, 3, 4, 4), 0),
        (lambda: torch.nn.Conv3d(8, 6, 3, padding=1, groups=2), (1, 8, 4, 5, 5), 0),
        (lambda: torch.nn.Conv2d(8, 6, 3, stride=2), (2, 8, 9, 9), 0),
    ],
    ids=["taps", "time-stride", "pointwise", "groups", "2d"],
)
def test_convolutions_lower_as_the_flax_models_do(conv, shape, taps):
    """aten.convolution under the runtime equals PyTorch's; a 3D conv with a time kernel and no time padding or
    stride becomes one 2D conv per tap on CPU (as in models/common/conv.py), the others stay as torchax lowers them."""
    import jax
    import jax.numpy as jnp

    from converter.torchax_runtime import torchax_env

    env = torchax_env()  # imports torchax
    from torchax import interop

    torch.manual_seed(0)
    module, x = conv(), torch.randn(shape)
    with torch.no_grad():
        expected = module(x).numpy()
    with env, torch.no_grad():
        on_jax = module.to("jax")

        def run(array):
            return on_jax(interop.torch_view(array)).jax()

        got = np.asarray(run(jnp.asarray(x.numpy())))
        convs = [
            e for e in jax.make_jaxpr(run)(jnp.asarray(x.numpy())).eqns if e.primitive.name == "conv_general_dilated"
        ]
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-5
    ranks = [e.invars[0].aval.ndim for e in convs]
    assert ranks == ([4] * taps if taps else [len(shape)])
