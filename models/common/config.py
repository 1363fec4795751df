"""What the families' configs share: read from / written as a diffusers `config.json`, checked against the field
types before anything is built."""

from __future__ import annotations

import dataclasses
import math
import types
import typing


class ConfigError(ValueError):
    """A config.json this model cannot be built from: unknown field, wrong type or range, unsupported option."""


@dataclasses.dataclass(frozen=True)
class DiffusersConfig:
    """A frozen dataclass whose fields and defaults are a diffusers class's `__init__` arguments.

    Values are checked against the field types (integers, and integers in lists, are at least 1; floats are finite);
    subclasses set `class_name` and may override `ensure_supported` to refuse configs they cannot run."""

    class_name: typing.ClassVar[str] = ""
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
        for name in known & set(raw):
            problem = _type_problem(raw[name], hints[name])
            if problem:
                raise ConfigError(f"config.json: {name} is {raw[name]!r}, {problem}")
        config = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})
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


def _type_problem(value, hint) -> str | None:
    """Why `value` (from JSON) does not fit the annotation `hint`, or None."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        problems = [_type_problem(value, arm) for arm in typing.get_args(hint)]
        return None if None in problems else "expected " + " or ".join(p.removeprefix("expected ") for p in problems)
    if hint is type(None):
        return None if value is None else "expected null"
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, (list, tuple)):
            return f"expected a list of {_name(item)}"
        problems = [_type_problem(v, item) for v in value]
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
        return None if value >= 1 else "expected an integer of at least 1"
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return "expected a number"
        return None if math.isfinite(value) else "expected a finite number"
    if hint is str:
        return None if isinstance(value, str) else "expected a string"
    raise TypeError(f"config field type {hint} has no check")


def _name(hint) -> str:
    return {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(hint, str(hint))
