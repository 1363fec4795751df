"""The contract every family's models keep, written once: what a family provides, what its models take and give,
what the converter asks of each kind of model, and where one family may plug into another's code.

A family is a folder (models/<family>/) holding
  config.py          a `DiffusersConfig` subclass: diffusers' `__init__` arguments as typed, bounded fields,
                     `class_name`, `variant` and `latent_scaling` (models/common/config.py); its tiling settings
  modeling_flax.py   the Flax NNX model, `FlaxVAE` below; parameter paths as diffusers' state_dict keys
  modeling_torch.py  the PyTorch model for torchax, `TorchVAE` below (a `ChunkedAutoencoder`); diffusers' names and
                     layouts, so its state_dict is diffusers' checkpoint
  spec.py            its `FamilySpec` (models/common/spec.py): names, Hub repos, the kind of sample, validation shapes
  testing.py         its test data (models/common/testing.py)
and mappings/<family>.yaml (or a mapping file it shares with the classes of its architecture), tests/test_<folder>.py,
its data files named in tests/data/README.md, and its entry in converter/registry.py (an import and a place in
`FAMILY_SPECS`). Nothing in converter/ names a family.

Samples and ranks. A model takes the rank diffusers' class takes, channels-first in PyTorch, and the same array with its
channel axis (axis 1) moved last in Flax: a video (B, C, T, H, W) is (B, T, H, W, C); an image (B, C, H, W) is (B, H, W,
C); a waveform (B, C, samples) is (B, samples, C); an image class that takes a frame axis of one (Qwen-Image's (B, C, 1,
H, W)) keeps it. The spec says which (`frame_axis`). Latents follow the same rule. Generic code (runners, validation,
tiling, meshes, the picture) moves axes by rank and never asks which kind it holds. Every model checks its inputs' rank,
channels and frames (models/common/inputs.py) and says what it expected in one ValueError.

Parts. A model declares its parts (`FamilySpec.parts`): an autoencoder's encoder and decoder, or a decoder alone (a
vocoder). Each part is a `Part`: (x, cache, **inputs) -> (x, cache), one chunk of frames with the cache the previous
chunk returned (None first; an image or any part without history returns None), plus the 1x1 quant convs around the
latent (`quant_conv`, `post_quant_conv`, either None, or what a class has in their place: a posterior head). `encode`
gives what diffusers' encode output holds (`FamilySpec.encode_outputs`, `encoded` below): its latent distribution's
(mean, logvar), or a deterministic encoder's latents. Validation, tiling, meshes, the benchmark and `info` ask only for
the parts a model has.

Running. The chunk runners (models/common/steps_flax.py, steps_torch.py) run a part as chunks of frames, one compiled
step per chunk shape with the causal cache passed in and out explicitly (`run_chunks`, `run_clip`), or whole in one
step (`run_image`: a sample without a frame axis). A step returns its cache only where its part runs in more than
one chunk (`keeps_cache`). Extra decode inputs (a timestep, noise maps) are keyword arguments named as diffusers
names them, taken by `decode` and handed to the decoder of every chunk and tile.

Tiling. `enable_tiling(**settings)` / `disable_tiling()` with diffusers' keywords (`TilingMixin`, models/common/
tiling.py): the model's `tiling_class` is its settings dataclass, whose `plans(config)` gives each part's `TilePlan`
(and, for framewise tiling, `frame_tiles`); `tile_plan(part)` is None until tiling is enabled. A plan cuts, runs and
joins the tiles (`TilePlan.run`): a family whose diffusers class joins its tiles otherwise subclasses TilePlan.

Meshes. Given a ("dp", "tp") mesh, the Flax runners split the batch over "dp" and the width (the axis before the
channels) over "tp"; convolutions exchange their halos (models/common/conv.py). Any rank with a width works.

Validation. The spec's `validation_latent_shape` and `validation_sample_shape` give inputs of the model's rank, of
sizes that do not grow with the config beyond its released models' (converter/validate.py bounds them), compared in
float32 against the project's PyTorch model on the source weights, and drawn in validation.png.

The benchmark. It measures each part a model has at the spec's `native_size` (compile-only rows) and its validation
shapes (steady rows), in the model's rank.

Extension points: a family specialises another's models through named points, each stated where it is defined, and
no other: a class attribute naming a submodule class (Wan's `causal_conv`, models/wan/modeling_flax.py), a config
class variable (Wan's `frames`), a subclass adding a part (AutoencoderKLFlux2's `bn`), a TilePlan subclass."""

from __future__ import annotations

import inspect
from typing import Any, Generic, Protocol, runtime_checkable


@runtime_checkable
class Part(Protocol):
    """The encoder or the decoder: one chunk of frames, with the cache the previous chunk returned (None for the
    first), and the part's extra inputs -> (output chunk, the cache for the next chunk)."""

    def __call__(self, x, cache=None, **inputs) -> tuple[Any, Any]: ...


@runtime_checkable
class FlaxDecoder(Protocol):
    """What every Flax model has, a decoder alone (a vocoder) too: channels-last arrays of the rank diffusers' class
    takes: a video (B, T, H, W, C) and its latents (B, T, h, w, z); an image (B, H, W, C) and its latents
    (B, h, w, z); a mel spectrogram (B, T, mel bins, C) and its waveform (B, samples, C). Constructed as
    `cls(config, rngs=..., param_dtype=...)`; its initialisers must not draw random numbers (the abstract model is
    traced with no keys, converter/structure_cache.py)."""

    config: Any
    decoder: Part
    post_quant_conv: Any  # a 1x1x1 conv applied per chunk before the decoder, or None

    def decode(self, z, *, mesh=None, **inputs) -> Any: ...

    def enable_tiling(self, **settings) -> None: ...

    def disable_tiling(self) -> None: ...

    def tile_plan(self, part: str) -> Any: ...


@runtime_checkable
class FlaxVAE(FlaxDecoder, Protocol):
    """An autoencoder: a FlaxDecoder with an encoder."""

    encoder: Part
    quant_conv: Any  # a 1x1x1 conv applied per chunk after the encoder, or None

    def encode(self, x, *, mesh=None) -> Any:
        """-> (mean, logvar), as diffusers' latent distribution has them, or a deterministic encoder's latents."""
        ...


@runtime_checkable
class TorchDecoder(Protocol):
    """Channels-first tensors, as diffusers: `decode(z, **inputs).sample` (a vocoder also `model(mel)`, as
    diffusers calls it). Constructed as `cls(config)`. `step` is the chunk step to use (the torchax runtime passes
    its compiled one)."""

    config: Any
    decoder: Part
    post_quant_conv: Any

    def decode(self, z, *, step=None, **inputs) -> Any: ...

    def chunk_step(self, part: str, x, cache, inputs: dict, keep_cache: bool = True) -> tuple[Any, Any]: ...

    def enable_tiling(self, **settings) -> None: ...

    def disable_tiling(self) -> None: ...

    def tile_plan(self, part: str) -> Any: ...


@runtime_checkable
class TorchVAE(TorchDecoder, Protocol):
    """An autoencoder: a TorchDecoder with an encoder, `encode(x)` giving its `.latent_dist` or `.latents`."""

    encoder: Part
    quant_conv: Any

    def encode(self, x, *, step=None) -> Any: ...


def protocols(parts: tuple[str, ...]) -> tuple[type, type]:
    """The (Flax, PyTorch) protocols a family's models keep, by the parts it declares."""
    return (FlaxVAE, TorchVAE) if "encoder" in parts else (FlaxDecoder, TorchDecoder)


def signature_problems(implementation: type, protocol: type) -> list[str]:
    """Where `implementation`'s methods cannot be called as `protocol` declares them (a PyTorch module's `forward`
    stands for its `__call__`): the protocol's positional parameters lead, in order; each keyword-only one is there,
    keyword-only, with the same default; a parameter it adds (a family's extra input) is optional, and only where the
    protocol takes `**inputs`. Empty when it fits."""
    problems = []
    declared = {
        n: v
        for cls in reversed(protocol.__mro__)
        if cls not in (object, Protocol, Generic)
        for n, v in vars(cls).items()
        if inspect.isfunction(v) and (n == "__call__" or n[0] != "_")
    }
    for name, declaration in declared.items():
        if inspect.ismethod(implementation):  # a part that is one of its model's methods (a vocoder's decoder)
            method = implementation.__func__
        else:
            method = getattr(
                implementation, "forward" if name == "__call__" and hasattr(implementation, "forward") else name
            )
        want = list(inspect.signature(declaration).parameters.values())[1:]
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


def keeps_cache(bounds: list[tuple[int, int]]) -> bool:
    """Whether the steps of a part run in chunks of frames `bounds` return their cache: where there is more than one
    chunk. A part in one chunk (an image's one frame) returns None: Qwen-Image's cache of one 1024x1024 frame is 9.9
    GB, written for nothing. A clip's last chunk keeps it: it is the steady chunks' step, compiled once for all."""
    return len(bounds) > 1


def encoded(output) -> tuple:
    """What an encode gave, as a tuple in the order of `FamilySpec.encode_outputs`, whichever model gave it (ours in
    either framework, or diffusers'): an output's latent distribution's (mean, logvar) (or (mean, logs), where
    the class keeps a log standard deviation), or its `latents`; a Flax model's tuple, or its one array."""
    if hasattr(output, "latent_dist"):  # its spread as it stores it: a log-variance, or a log standard deviation
        dist = output.latent_dist
        return dist.mean, dist.logvar if hasattr(dist, "logvar") else dist.logs
    if hasattr(output, "latents"):
        return (output.latents,)
    return output if isinstance(output, tuple) else (output,)
