"""The torchax runtime: placeholders exactly for the named-tensor overloads torch 2.13 lacks (torchax 0.0.13), and
the ops it lowers as the Flax models compute them."""

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


@pytest.mark.usefixtures("cpu_conv_routes")  # the routes themselves (tests/conftest.py)
@pytest.mark.parametrize(
    "conv, shape, lowered",
    [
        (lambda: torch.nn.Conv3d(8, 6, 3, padding=(0, 1, 1)), (2, 8, 5, 7, 9), "winograd"),  # time unpadded
        (lambda: torch.nn.Conv3d(8, 32, 3, padding=(0, 1, 1)), (1, 8, 5, 4, 4), "2d per tap"),  # 48 positions
        (lambda: torch.nn.Conv3d(8, 64, 3, padding=(0, 1, 1)), (1, 8, 4, 3, 3), "matmul"),  # 18 positions, 64 out
        (lambda: torch.nn.Conv3d(8, 64, 3, padding=(0, 1, 1), stride=(1, 2, 2)), (1, 8, 3, 5, 4), "matmul"),
        (lambda: torch.nn.Conv3d(8, 6, (3, 1, 1), stride=(2, 1, 1)), (1, 8, 5, 4, 4), "3d"),  # Wan's time downsampling
        (lambda: torch.nn.Conv3d(8, 6, 1), (1, 8, 3, 4, 4), "3d"),
        (lambda: torch.nn.Conv3d(8, 6, 3, padding=1, groups=2), (1, 8, 4, 5, 5), "3d"),
        (lambda: torch.nn.Conv2d(8, 6, 3, stride=2), (2, 8, 9, 9), "2d"),
        (lambda: torch.nn.Conv2d(8, 6, 3, padding=1), (2, 8, 9, 9), "winograd"),
        (lambda: torch.nn.Conv1d(8, 6, 7, padding=9, dilation=3), (2, 8, 40), "1d"),  # a vocoder's
    ],
    ids=[
        "winograd",
        "taps",
        "matmul",
        "matmul-strided",
        "time-stride",
        "pointwise",
        "groups",
        "2d",
        "2d-winograd",
        "1d",
    ],
)
def test_convolutions_lower_as_the_flax_models_do(conv, shape, lowered):
    """aten.convolution under the runtime equals PyTorch's. On CPU (as in models/common/conv.py) a float32 3x3 conv
    at stride 1 padded by one, with enough output positions, is Winograd's F(2, 3) along the height (4 2D convs); a
    3D conv with a time kernel and no time padding or stride is otherwise one 2D conv per tap, or one batched matrix
    product over its taps when it has fewer output positions than output channels; the others stay as torchax lowers
    them; a 1D conv runs channels-last, as the Flax vocoders run theirs."""
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
        eqns = jax.make_jaxpr(run)(jnp.asarray(x.numpy())).eqns
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-5
    ranks = [e.invars[0].aval.ndim for e in eqns if e.primitive.name == "conv_general_dilated"]
    products = [e for e in eqns if e.primitive.name == "dot_general"]
    taps = module.kernel_size[0]
    assert (ranks, len(products)) == {
        "winograd": ([4] * 4, 0),
        "2d per tap": ([4] * taps, 0),
        "matmul": ([], 1),
        "3d": ([5], 0),
        "2d": ([4], 0),
        "1d": ([3], 0),
    }[lowered]
    if lowered == "1d":  # (N, W, C): the channels last
        (conv_eqn,) = [e for e in eqns if e.primitive.name == "conv_general_dilated"]
        assert conv_eqn.params["dimension_numbers"].lhs_spec == (0, 2, 1)


@pytest.mark.parametrize(
    "op, shapes, transposed",
    [
        (lambda x: torch.nn.functional.silu(x), [(2, 6, 3, 4, 5)], True),
        (lambda x, y: x + y, [(2, 6, 3, 4, 5), (2, 6, 3, 4, 5)], True),  # a residual sum
        (lambda x, y: torch.add(x, y, alpha=-0.5), [(1, 6, 4, 5), (1, 6, 4, 5)], True),
        (lambda x, y: x + y, [(2, 6, 3, 4, 5), (6, 1, 1, 1)], False),  # a broadcast bias stays as it is
        (lambda x: torch.nn.functional.silu(x), [(2, 6, 5)], False),  # not an image or a video
    ],
    ids=["silu", "residual", "alpha", "broadcast", "3-d"],
)
def test_activation_elementwise_ops_run_channels_last(op, shapes, transposed):
    """SiLU and sums of activations of one shape (N, C, ...) equal PyTorch's, computed on channels-last operands;
    anything else as torchax lowers it."""
    import jax
    import jax.numpy as jnp

    from converter.torchax_runtime import torchax_env

    env = torchax_env()
    from torchax import interop

    torch.manual_seed(0)
    inputs = [torch.randn(shape) for shape in shapes]
    expected = op(*inputs).numpy()

    def run(*arrays):
        with env:
            return op(*interop.torch_view(arrays)).jax()

    arrays = [jnp.asarray(x.numpy()) for x in inputs]
    got = np.asarray(run(*arrays))
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1e-6
    computed = [e for e in _equations(jax.make_jaxpr(run)(*arrays).jaxpr) if e.primitive.name in ("logistic", "add")]
    n, c, *rest = shapes[0]
    assert computed and {e.outvars[0].aval.shape for e in computed} == {(n, *rest, c) if transposed else (n, c, *rest)}


def _equations(jaxpr):
    """Every equation of a jaxpr, those of the jitted functions it calls included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _equations(inner)


def _attention(tokens: int, with_mask: bool):
    """F.scaled_dot_product_attention of one head over `tokens` tokens under the runtime, jitted, and torch's own."""
    import torch.nn.functional as F

    from converter.torchax_runtime import torchax_env

    env = torchax_env()  # imports torchax
    from torchax import interop

    q, k, v = (torch.randn(2, 1, tokens, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = torch.rand(tokens, tokens, generator=torch.Generator().manual_seed(3)) > 0.2 if with_mask else None
    mask = None if mask is None else mask | torch.eye(tokens, dtype=torch.bool)  # no row all masked
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with env:
        jitted = interop.jax_jit(lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        got = jitted(*(env.to_xla(x) for x in (q, k, v)), None if mask is None else env.to_xla(mask))
    return np.asarray(got.jax()), expected.numpy()


@pytest.mark.parametrize(("tokens", "with_mask"), [(5, False), (1500, False), (40, True)])
def test_attention_equals_pytorch_s(tokens, with_mask):
    """Unmasked attention in blocks (a partial last block at 1500 tokens); a masked one through torchax's own."""
    got, expected = _attention(tokens, with_mask)
    assert np.abs(got - expected).max() < 1e-5


def test_unmasked_attention_never_holds_the_whole_score_matrix():
    """The compiled attention over N tokens (the mid block of a 512-pixel square image at 8x, 384 channels) holds no
    N x N array: torchax's own lowering holds one (XLA:CPU's memory analysis leaves it out of the temporaries, so
    the compiled program is read instead)."""
    import jax
    import torch.nn.functional as F

    from converter.torchax_runtime import torchax_env

    env = torchax_env()  # imports torchax
    from torchax import interop

    n = 4096
    spec = jax.ShapeDtypeStruct((1, 1, n, 384), jax.numpy.float32)
    with env:
        compiled = jax.jit(interop.jax_view(F.scaled_dot_product_attention)).lower(spec, spec, spec).compile()
    assert f"[{n},{n}]" not in compiled.as_text() and f"[1,{n},{n}]" not in compiled.as_text()


@pytest.mark.parametrize(
    "channels, length, kernel, ratio, with_beta, dtype",
    [
        (6, 11, 12, 2, True, torch.float32),  # BigVGAN's filters (LTX-2.3, MiniMax-H3)
        (4, 5, 8, 2, False, torch.float32),  # plain Snake (LTX-2's vocoder configs allow it)
        (3, 7, 9, 3, True, torch.float32),  # an odd kernel at another ratio
        (5, 9, 12, 2, True, torch.bfloat16),  # a bfloat16 signal, float32 parameters: computed as they promote
    ],
    ids=["snakebeta", "snake", "odd-kernel", "promoted"],
)
def test_anti_aliased_snake_lowers_to_one_function_equal_to_pytorchs(channels, length, kernel, ratio, with_beta, dtype):
    """The vocoders' anti-aliased SnakeBeta under the runtime equals the op's own PyTorch body, dtype included, and
    runs as one jitted function its calls share: traced once a shape, not op by op."""
    import jax
    import jax.numpy as jnp

    from converter.models.common.layers_torch import anti_aliased_snake
    from converter.torchax_runtime import torchax_env

    env = torchax_env()
    from torchax import interop

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, channels, length, generator=generator).to(dtype)
    up, down = (torch.rand(kernel, generator=generator) / kernel for _ in range(2))
    alpha, beta = (torch.randn(channels, generator=generator) * 0.3 for _ in range(2))
    params = (up, down, alpha, beta if with_beta else None)
    expected = anti_aliased_snake(x, *params, ratio)

    def twice(x, *params):  # two activations of one shape, as a vocoder's resblock runs them
        with env:
            x, params = interop.torch_view((x, params))
            return [anti_aliased_snake(x, *params, ratio).jax() for _ in range(2)]

    arrays = [jnp.asarray(x.float().numpy()).astype(str(x.dtype).removeprefix("torch."))]
    arrays += [None if p is None else jnp.asarray(p.numpy()) for p in params]
    got, _ = twice(*arrays)
    assert expected.dtype == torch.float32 and got.dtype == jnp.float32
    assert np.abs(np.asarray(got) - expected.numpy()).max() <= 1e-6
    calls = [
        e.params["jaxpr"]
        for e in jax.make_jaxpr(twice)(*arrays).jaxpr.eqns
        if e.primitive.name in ("pjit", "jit") and e.params["name"] == "anti_aliased_snake"
    ]
    assert len(calls) == 2 and calls[0] is calls[1]
