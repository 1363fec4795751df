"""What the families' configs share: read from / written as a diffusers `config.json`."""
from __future__ import annotations

import dataclasses

from converter.errors import InputError


@dataclasses.dataclass(frozen=True)
class DiffusersConfig:
    """A frozen dataclass whose fields and defaults are a diffusers class's `__init__` arguments.

    Subclasses set `class_name` and may override `check` to refuse configs they cannot run."""

    class_name = ""

    @classmethod
    def from_dict(cls, raw: dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in raw if k not in known and not k.startswith("_"))
        if unknown:
            raise InputError(f"config.json has fields {cls.class_name} does not take: {', '.join(unknown)}")
        config = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})
        config.check()
        return config

    def check(self):
        pass

    def to_dict(self) -> dict:
        """The diffusers config.json content, so diffusers' `from_pretrained` reads our torchax output."""
        out = {"_class_name": self.class_name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
