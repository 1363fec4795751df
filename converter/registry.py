"""The model families and the model names users type (`vae-convert wan2.1`).

Each family's spec lives beside its implementations (models/<family>/spec.py); a family's entry here is its spec's
import and its place in `FAMILY_SPECS` (the order `list` shows).
"""

from __future__ import annotations

import dataclasses
import json
import math

from converter.errors import InputError, UsageError
from converter.models.autoencoderkl.spec import AUTOENCODERKL, FLUX2
from converter.models.autoencodertiny.spec import AUTOENCODERTINY
from converter.models.cogvideox.spec import COGVIDEOX
from converter.models.common.config import MAX_PARAMETERS, MULTIPLIER, WIDTH, ConfigError
from converter.models.common.spec import FamilySpec
from converter.models.hunyuanvideo.spec import HUNYUANVIDEO
from converter.models.ltx.spec import LTX, LTX2
from converter.models.ltx2audio.spec import LTX2AUDIO
from converter.models.ltx2vocoder.spec import LTX2VOCODER, LTX2VOCODERBWE
from converter.models.minimaxh3.spec import MINIMAXH3
from converter.models.minimaxh3audio.spec import MINIMAXH3AUDIO
from converter.models.qwenimage.spec import QWENIMAGE
from converter.models.qwenimage21.spec import QWENIMAGE21
from converter.models.wan.spec import WAN

FAMILIES: dict[str, FamilySpec] = {}
# the decode-side components of a pipeline a family's class may be (diffusers' model_index keys), in `list`'s order
COMPONENTS = ("vae", "audio_vae", "vocoder")


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    family: FamilySpec
    repo_id: str
    subfolder: str
    revision: str
    config: dict  # what differs from the family's defaults
    component: str = "vae"  # the pipeline component it is (the family's)

    @property
    def qualified(self) -> str:
        """The name with its component where that is not the VAE (`ltx-2:audio_vae`), as MODEL takes it."""
        return self.name if self.component == "vae" else f"{self.name}:{self.component}"

    @property
    def command(self) -> str:
        """The command that converts it."""
        return f"vae-convert {self.name}" + (f" --component {self.component}" if self.component != "vae" else "")


MODELS: dict[str, ModelEntry] = {}  # the names users type, for the pipelines' VAE
COMPONENT_MODELS: dict[tuple[str, str], ModelEntry] = {}  # (name, component) for every component of a pipeline


def register(family: FamilySpec) -> None:
    """Adds a family and its model names, under its component (a name already taken there is a mistake in the
    specs)."""
    names = [name for m in family.models for name in (m.name, *m.aliases)]
    taken = [n for n in names if (n, family.component) in COMPONENT_MODELS] + [family.name] * (family.name in FAMILIES)
    if taken:
        raise ValueError(f"family {family.name}: {', '.join(taken)} already registered")
    FAMILIES[family.name] = family
    for m in family.models:
        for name in (m.name, *m.aliases):
            entry = ModelEntry(m.name, family, m.repo_id, m.subfolder, m.revision, m.config, family.component)
            COMPONENT_MODELS[(name, family.component)] = entry
            if family.component == "vae":
                MODELS[name] = entry


FAMILY_SPECS = (
    WAN, COGVIDEOX, QWENIMAGE, QWENIMAGE21, HUNYUANVIDEO, LTX, LTX2, AUTOENCODERKL, FLUX2, AUTOENCODERTINY, LTX2AUDIO,
    LTX2VOCODER, LTX2VOCODERBWE, MINIMAXH3, MINIMAXH3AUDIO,
)  # fmt: skip
for _family in FAMILY_SPECS:
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
        COMPONENT_MODELS[(m.name, family.component)]
        for m in family.models
        if family.config_class.from_dict(m.config).variant == config.variant
    )


def first_of_each_variant() -> list[ModelEntry]:
    """One model per distinct VAE (Wan 2.1, Wan 2.2, CogVideoX): its first name (full-size tests, benchmark)."""
    firsts = {}
    for family in FAMILIES.values():
        for m in family.models:
            firsts.setdefault(
                family.config_class.from_dict(m.config).variant, COMPONENT_MODELS[(m.name, family.component)]
            )
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


def get_model(name: str, component: str | None = None) -> ModelEntry:
    """The entry of MODEL as the command line takes it: a name, the pipeline component `component` of it (by default
    its VAE), or `name:component`. A name nobody registered is bad input; a component the model has not, a usage
    error."""
    name, _, qualified = name.partition(":")
    if qualified and component and qualified != component:
        raise UsageError(f"{name}:{qualified} and --component {component} name two components; give one")
    component = qualified or component or "vae"
    if (name, component) in COMPONENT_MODELS:
        return COMPONENT_MODELS[(name, component)]
    has = components_of(name)
    if not has:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted({n for n, _ in COMPONENT_MODELS}))}")
    raise UsageError(f"{name} has no {component} component (its components: {', '.join(has)})")


EVERY_COMPONENT = "all"  # --component all: each decode-side component the model has


def get_models(name: str, component: str | None = None) -> list[ModelEntry]:
    """`get_model`'s entry, or with the component `all` the entries of every decode-side component of the model, its
    VAE first."""
    base, _, qualified = name.partition(":")
    if EVERY_COMPONENT not in (qualified, component):
        return [get_model(name, component)]
    if qualified and component and qualified != component:
        raise UsageError(f"{base}:{qualified} and --component {component} name two components; give one")
    return [get_model(base, c) for c in components_of(base)] or [get_model(base)]


def format_model(name: str, families: tuple[str, ...]) -> ModelEntry | None:
    """The entry a mapping file's source format names as its `model`: of the component its families are."""
    component = FAMILIES[families[0]].component if families and families[0] in FAMILIES else "vae"
    return COMPONENT_MODELS.get((name, component))


def components_of(name: str) -> list[str]:
    """The pipeline components a model name has, the VAE first."""
    return [c for c in COMPONENTS if (name, c) in COMPONENT_MODELS]


def family_for_class(class_name: str) -> FamilySpec | None:
    return next((f for f in FAMILIES.values() if f.class_name == class_name), None)


def first_model(family: FamilySpec) -> ModelEntry:
    """The entry of `family`'s first model name, as its component."""
    return COMPONENT_MODELS[(family.models[0].name, family.component)]


def command_for(family: FamilySpec) -> str:
    """The command that converts a checkpoint of `family` (for hints): its first model name."""
    return first_model(family).command


def command_for_config(family: FamilySpec, raw: dict) -> str:
    """The command that converts a checkpoint of `family` with config.json content `raw`: the first model name of
    its variant (Wan 2.2's, not Wan 2.1's), or of the family where the config does not build."""
    try:
        return model_for(family, family.config_class.from_dict(raw)).command
    except (ConfigError, TypeError, ValueError, StopIteration):
        return command_for(family)
