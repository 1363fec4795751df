"""The model families and the model names users type (`vae-convert wan2.1`).

Each family's spec lives beside its implementations (models/<family>/spec.py); adding a family is one line here
(the tuple `register` is called on).
"""

from __future__ import annotations

import dataclasses
import json
import math

from converter.errors import InputError
from converter.models.autoencoderkl.spec import AUTOENCODERKL, FLUX2
from converter.models.cogvideox.spec import COGVIDEOX
from converter.models.common.config import MAX_PARAMETERS, MULTIPLIER, WIDTH, ConfigError
from converter.models.common.spec import FamilySpec
from converter.models.hunyuanvideo.spec import HUNYUANVIDEO
from converter.models.ltx.spec import LTX, LTX2
from converter.models.qwenimage.spec import QWENIMAGE
from converter.models.qwenimage21.spec import QWENIMAGE21
from converter.models.wan.spec import WAN

FAMILIES: dict[str, FamilySpec] = {}


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    family: FamilySpec
    repo_id: str
    subfolder: str
    revision: str
    config: dict  # what differs from the family's defaults


MODELS: dict[str, ModelEntry] = {}


def register(family: FamilySpec) -> None:
    """Adds a family and its model names (a name already taken is a mistake in the specs)."""
    names = [name for m in family.models for name in (m.name, *m.aliases)]
    taken = [name for name in names if name in MODELS] + [family.name] * (family.name in FAMILIES)
    if taken:
        raise ValueError(f"family {family.name}: {', '.join(taken)} already registered")
    FAMILIES[family.name] = family
    for m in family.models:
        for name in (m.name, *m.aliases):
            MODELS[name] = ModelEntry(m.name, family, m.repo_id, m.subfolder, m.revision, m.config)


for _family in (WAN, COGVIDEOX, QWENIMAGE, QWENIMAGE21, HUNYUANVIDEO, LTX, LTX2, AUTOENCODERKL, FLUX2):
    register(_family)


def ensure_plausible_size(config, shapes) -> None:
    """Refuses a config whose (abstract) model has more parameters than any real VAE could: each field is bounded
    (models/common/config.py), but widths multiply."""
    count = sum(math.prod(shape) for shape in shapes)
    if count > MAX_PARAMETERS:
        widths = ", ".join(n for n, b in type(config).bounds.items() if b in (WIDTH, MULTIPLIER))
        raise InputError(
            f"the config's widths ({widths}) make a model of {count / 1e9:.4g} G parameters, more than the "
            f"{MAX_PARAMETERS / 1e9:g} G of any real VAE; the config is not a real model's"
        )


def config_from_dict(family: FamilySpec, raw: dict, where: str | None = None):
    """The family's config from a config.json's content; a config it cannot be built from is bad input (the message
    names `where` the config came from)."""
    try:
        return family.config_class.from_dict(raw)
    except ConfigError as e:
        message = str(e)  # the config classes say "config.json": name the one it was
        if where:
            rest = message.removeprefix("config.json")
            message = f"{where}{rest}" if rest != message else f"{where}: {message}"
        raise InputError(message) from None


def small_config(entry: ModelEntry) -> dict:
    """The family's first small widths of the same variant as `entry` (`random-checkpoint --small`)."""
    family = entry.family
    variant = family.config_class.from_dict(entry.config).variant
    small = family.testing().small_configs.values()
    return next(c for c in small if family.config_class.from_dict(c).variant == variant)


def model_for(family: FamilySpec, config) -> ModelEntry:
    """The family's first model name of `config`'s variant."""
    return next(
        MODELS[m.name] for m in family.models if family.config_class.from_dict(m.config).variant == config.variant
    )


def first_of_each_variant() -> list[ModelEntry]:
    """One model per distinct VAE (Wan 2.1, Wan 2.2, CogVideoX): its first name (full-size tests, benchmark)."""
    firsts = {}
    for family in FAMILIES.values():
        for m in family.models:
            firsts.setdefault(family.config_class.from_dict(m.config).variant, MODELS[m.name])
    return list(firsts.values())


def distinct_configs(family: FamilySpec) -> list[tuple[str, dict]]:
    """The named models' configs, each once, under its first name."""
    distinct = {}
    for m in family.models:
        distinct.setdefault(json.dumps(m.config, sort_keys=True), (m.name, m.config))
    return list(distinct.values())


def configs_to_check(family: FamilySpec) -> list[tuple[str, dict]]:
    """Every distinct config a family's mapping must hold for: the named models', then the family's extra ones."""
    return distinct_configs(family) + list(family.testing().check_configs)


def get_model(name: str) -> ModelEntry:
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def family_for_class(class_name: str) -> FamilySpec | None:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)


def command_for(family: FamilySpec) -> str:
    """The command that converts a checkpoint of `family` (for hints): its first model name."""
    return f"vae-convert {family.models[0].name}"


def command_for_config(family: FamilySpec, raw: dict) -> str:
    """The command that converts a checkpoint of `family` with config.json content `raw`: the first model name of
    its variant (Wan 2.2's, not Wan 2.1's), or of the family where the config does not build."""
    try:
        return f"vae-convert {model_for(family, family.config_class.from_dict(raw)).name}"
    except (ConfigError, TypeError, ValueError, StopIteration):
        return command_for(family)
