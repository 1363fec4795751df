"""What the families' configs share: read from / written as a diffusers `config.json`, checked against the field
types before anything is built."""

from __future__ import annotations

import dataclasses
import math
import reprlib
import sys
import types
import typing


class ConfigError(ValueError):
    """A config.json this model cannot be built from: unknown field, wrong type or range, unsupported option."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """The largest value a config field may take, and why. Configs are untrusted bytes: a layer count of 10**7 is a
    file of a few bytes whose (abstract) model would be built without end, and a width of 2**40 overflows PyTorch's
    size arithmetic; bounds a few times what released models use keep every build short and every size exact. The
    smallest is 1 but for counts that may be none."""

    maximum: int
    why: str
    minimum: int = 1


# the roles a family's fields play, each bounded at a few times what any released VAE has
WIDTH = Bound(8192, "a channel count; the widest released VAE layer has 2048")
MULTIPLIER = Bound(64, "a width multiplier; released VAEs use up to 8")
LAYERS = Bound(32, "a layer count; released VAEs have up to 6 per level")
STRIDE = Bound(64, "a patch size or compression ratio; released VAEs use up to 32")
PIXELS = Bound(65536, "a size in pixels")
# entries of a per-level list: released VAEs have up to 5 (4 levels and the mid block, LTX's); validation inputs and
# every activation grow as 2 ** levels, so a few more is the bound, not a list's length as such
LEVELS = 8
MAX_PARAMETERS = 8 * 10**9  # the largest released VAE has 1.3 G; 8 G in fp32 is 32 GB, as much as a host converts


@dataclasses.dataclass(frozen=True)
class Level:
    """One level of an encoder or decoder, as diffusers' constructors plan it, so that a family's two implementations
    build the same levels from one plan (its config's `down_levels()` and `up_levels()`)."""

    in_channels: int
    out_channels: int
    resample: bool  # the level ends in a down- or upsampler (every level but the last)
    temporal: bool  # that sampler also resamples time
    attention: bool = False  # attention after each of the level's resnets


@dataclasses.dataclass(frozen=True)
class DiffusersConfig:
    """A frozen dataclass whose fields and defaults are a diffusers class's `__init__` arguments.

    Values are checked against the field types (integers, and integers in lists, are at least 1; floats are finite);
    subclasses set `class_name` and may override `ensure_supported` to refuse configs they cannot run."""

    class_name: typing.ClassVar[str] = ""
    # each integer field's bound (and a float field's that sets a size): every such field has one
    bounds: typing.ClassVar[dict[str, Bound]] = {}
    # Keys published config.json files carry that the pinned diffusers no longer takes (and ignores, as we do).
    retired_fields: typing.ClassVar[tuple[str, ...]] = ()

    @classmethod
    def ignored_fields(cls, raw: dict) -> list[str]:
        """The retired keys `raw` carries: `from_dict` ignores them, callers say so."""
        return sorted(k for k in raw if k in cls.retired_fields)

    @classmethod
    def from_dict(cls, raw: dict):
        """The config of a config.json's content, or a ConfigError naming the first field that does not fit."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in raw if k not in known and k not in cls.retired_fields and not k.startswith("_"))
        if unknown:
            raise ConfigError(f"config.json has fields {cls.class_name} does not take: {', '.join(unknown)}")
        hints = typing.get_type_hints(cls)
        unbounded = sorted(n for n in known if "int" in str(hints[n]) and n not in cls.bounds)
        if unbounded:
            raise TypeError(f"{cls.__name__}: fields without a bound: {', '.join(unbounded)}")
        for name in sorted(known & set(raw)):
            problem = _type_problem(raw[name], hints[name], cls.bounds.get(name))
            if problem:
                raise ConfigError(f"config.json: {name} is {shown(raw[name])}, {problem}")
        config = cls(**{k: _as_field(v, hints[k]) for k, v in raw.items() if k in known})
        config.ensure_supported()
        return config

    def ensure_supported(self):
        pass

    @property
    def latent_scaling(self) -> str:
        """How a pipeline scales this VAE's latents, in words (`vae-convert list`)."""
        raise NotImplementedError

    @property
    def variant(self) -> str:
        """What users call this architecture (`vae-convert list` shows it; a model name must fit it)."""
        return self.class_name

    def to_dict(self) -> dict:
        """The diffusers config.json content, so diffusers' `from_pretrained` reads our torchax output."""
        out = {"_class_name": self.class_name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


def _as_field(value, hint):
    """A checked JSON value as its field holds it: lists as tuples, nested ones too (a config is hashable and
    compares by value), and integers where the field takes numbers as floats (as Python computes with them; a
    jitted function would take a large one as an int32 and overflow)."""
    if isinstance(value, list):
        lists = [arm for arm in _arms(hint) if typing.get_origin(arm) is tuple]
        return tuple(_as_field(v, typing.get_args(lists[0])[0] if lists else None) for v in value)
    if isinstance(value, int) and not isinstance(value, bool) and float in _arms(hint):
        return float(value)
    return value


def _arms(hint) -> tuple:
    """A field type's alternatives: `float | None` gives float and None."""
    if hint is None:
        return ()
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _type_problem(value, hint, bound: Bound | None) -> str | None:
    """Why `value` (from JSON) does not fit the annotation `hint` and the field's `bound`, or None."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        problems = [_type_problem(value, arm, bound) for arm in typing.get_args(hint)]
        return None if None in problems else "expected " + " or ".join(p.removeprefix("expected ") for p in problems)
    if hint is type(None):
        return None if value is None else "expected null"
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            return f"expected a list of {_name(item)}"
        # lists of numbers hold a value per latent channel (statistics); the others, a value per level
        entries, why = (WIDTH.maximum, "one per channel") if item is float else (LEVELS, "one per level")
        if len(value) > entries:
            return f"expected a list of at most {entries} entries ({why})"
        problems = [_type_problem(v, item, bound) for v in value]
        return next(
            (
                f"expected a list of {_name(item)} ({p.removeprefix('expected ')} at entry {i})"
                for i, p in enumerate(problems)
                if p
            ),
            None,
        )
    if hint is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            return "expected an integer"
        return _range_problem(value, "an integer", bound)
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return "expected a number"
        if abs(value) > sys.float_info.max or not math.isfinite(value):  # an integer past any float, too
            return "expected a finite number"
        return _range_problem(value, "a number", bound) if bound else None
    if hint is str:
        return None if isinstance(value, str) else "expected a string"
    raise TypeError(f"config field type {hint} has no check")


def _range_problem(value, kind: str, bound: Bound) -> str | None:
    if bound.minimum <= value <= bound.maximum:
        return None
    return f"expected {kind} from {bound.minimum} to {bound.maximum} ({bound.why})"


def _name(hint) -> str:
    return {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(hint, str(hint))


def shown(value) -> str:
    """An untrusted value (JSON, YAML) in a one-line message, bounded: a long list, or YAML aliases sharing one
    object, would make a plain repr without end."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 3, 6, 6, 80, 80
