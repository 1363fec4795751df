"""What a family provides, written once. A family folder (models/<family>/) holds:

  config.py          a `DiffusersConfig` subclass: diffusers' `__init__` arguments as typed fields, `class_name`,
                     `variant` and `latent_scaling` (models/common/config.py)
  modeling_flax.py   the Flax NNX model, `FlaxVAE` below; parameter names as diffusers' state_dict keys
  modeling_torch.py  the PyTorch model for torchax, `TorchVAE` below (a `ChunkedAutoencoder`); diffusers' names
                     and layouts, so its state_dict is diffusers' checkpoint
  testing.py         its test data (models/common/testing.py)
  spec.py            its `FamilySpec` (models/common/spec.py): names, Hub repos, validation shapes

and mappings/<family>.yaml, tests/test_<family>.py and one line in converter/registry.py. Both models run a video as
chunks of frames through one step per chunk shape, the causal cache passed in and returned explicitly
(models/common/steps_flax.py, steps_torch.py); tiling comes from `TilingMixin` with the family's settings class.
Extra decode inputs (a timestep, for instance) are keyword arguments named as diffusers names them, taken by
`decode` and handed by the chunk runners to the decoder of every chunk and tile."""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Part(Protocol):
    """The encoder or the decoder: one chunk of frames, with the cache the previous chunk returned (None for the
    first), and the part's extra inputs -> (output chunk, the cache for the next chunk)."""

    def __call__(self, x, cache=None, **inputs) -> tuple[Any, Any]: ...


@runtime_checkable
class FlaxVAE(Protocol):
    """Channels-last arrays: video (B, T, H, W, C), latents (B, T, H, W, z). Constructed as
    `cls(config, rngs=..., param_dtype=...)`; its initialisers must not draw random numbers (the abstract model is
    traced with no keys, converter/structure_cache.py)."""

    config: Any
    encoder: Part
    decoder: Part
    quant_conv: Any  # a 1x1x1 conv applied per chunk after the encoder, or None
    post_quant_conv: Any  # a 1x1x1 conv applied per chunk before the decoder, or None

    def encode(self, x, *, mesh=None) -> tuple[Any, Any]:
        """-> (mean, logvar), as diffusers' latent distribution has them."""
        ...

    def decode(self, z, *, mesh=None, **inputs) -> Any: ...

    def enable_tiling(self, **settings) -> None: ...

    def disable_tiling(self) -> None: ...

    def tile_plan(self, part: str) -> Any: ...


@runtime_checkable
class TorchVAE(Protocol):
    """Channels-first tensors, as diffusers: `encode(x).latent_dist`, `decode(z, **inputs).sample`. Constructed as
    `cls(config)`. `step` is the chunk step to use (the torchax runtime passes its compiled one)."""

    config: Any
    encoder: Part
    decoder: Part
    quant_conv: Any
    post_quant_conv: Any

    def encode(self, x, *, step=None) -> Any: ...

    def decode(self, z, *, step=None, **inputs) -> Any: ...

    def chunk_step(self, part: str, x, cache, inputs: dict) -> tuple[Any, Any]: ...

    def enable_tiling(self, **settings) -> None: ...

    def disable_tiling(self) -> None: ...

    def tile_plan(self, part: str) -> Any: ...


def signature_problems(implementation: type, protocol: type) -> list[str]:
    """Where `implementation`'s methods cannot be called as `protocol` declares them (a PyTorch module's `forward`
    stands for its `__call__`): the protocol's positional parameters lead, in order; each keyword-only one is there,
    keyword-only, with the same default; a parameter it adds (a family's extra input) is optional, and only where the
    protocol takes `**inputs`. Empty when it fits."""
    problems = []
    for name in [n for n, v in vars(protocol).items() if inspect.isfunction(v) and (n == "__call__" or n[0] != "_")]:
        method = getattr(
            implementation, "forward" if name == "__call__" and hasattr(implementation, "forward") else name
        )
        want = list(inspect.signature(vars(protocol)[name]).parameters.values())[1:]
        got = list(inspect.signature(method).parameters.values())[1:]
        where = f"{implementation.__qualname__}.{method.__name__}"
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        want_positional = [p for p in want if p.kind in positional]
        got_positional = [p for p in got if p.kind in positional]
        if len(got_positional) < len(want_positional) or any(
            w.default is not g.default and w.default != g.default for w, g in zip(want_positional, got_positional)
        ):
            problems.append(
                f"{where}: takes {inspect.Signature(got)} where the protocol takes {inspect.Signature(want)}"
            )
            continue
        got_by_name = {p.name: p for p in got}
        for w in (p for p in want if p.kind is inspect.Parameter.KEYWORD_ONLY):
            g = got_by_name.get(w.name)
            if g is None or g.kind is not w.kind or g.default != w.default:
                problems.append(f"{where}: {w.name} must be keyword-only with default {w.default!r}")
        extras = got_positional[len(want_positional) :] + [
            p for p in got if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in {w.name for w in want}
        ]
        takes_inputs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in want)
        for extra in extras:
            if extra.default is inspect.Parameter.empty or not takes_inputs:
                problems.append(f"{where}: {extra.name} is not an optional input the protocol allows")
    return problems
