"""A model family's spec: what the converter, the tests and the benchmark need to know about one VAE architecture,
kept beside its implementations. converter/registry.py lists the families; nothing else names them."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from .config import DiffusersConfig
from .testing import FamilyTesting


def lazy(package: str, module: str, name: str) -> Callable[[], object]:
    """A loader of `name` from `module` (relative to `package`), importing it only when called: a spec names its
    implementations and test data without importing Flax, PyTorch or the model code."""

    def load():
        return getattr(importlib.import_module(module, package), name)

    return load


@dataclasses.dataclass(frozen=True)
class ModelName:
    """A name users type (`vae-convert wan2.1`) and where that model's VAE lives on the Hub."""

    name: str
    repo_id: str
    subfolder: str = "vae"
    revision: str = "main"
    config: dict = dataclasses.field(default_factory=dict)  # what differs from the family's defaults
    aliases: tuple[str, ...] = ()  # other names users type for it
    verified: bool = True  # False: no public page of the repo itself was found; the id follows the family's naming


@dataclasses.dataclass(frozen=True)
class FamilySpec:
    name: str
    config_class: type[DiffusersConfig]
    # The two implementations, imported on demand so that the CLI starts without Flax or the model code.
    flax_model: Callable[[], type]
    torch_model: Callable[[], type]
    testing: Callable[[], FamilyTesting]  # its test data (models/common/testing.py), imported on demand too
    mapping_file: str  # in mappings/
    models: tuple[ModelName, ...]
    # (config) -> shapes of the validation inputs, channels-first: latent (B, z, T, H, W), video (B, C, T, H, W); the
    # video encodes to the latent's height and width, so decoding its encoding (for validation.png) reuses the steps
    validation_latent_shape: Callable
    validation_video_shape: Callable
    # (config) -> the extra inputs validation decodes with, {diffusers' keyword: array over the validation batch}:
    # fixed values, which the report and the manifest name (a timestep for a timestep-conditioned decoder); None
    # where decode takes latents only
    validation_decode_inputs: Callable | None = None
    clamps_output: bool = False  # whether decode clamps to [-1, 1], as diffusers' model does
    # (safetensors header metadata) -> the diffusers config an original file carries, for formats whose files keep
    # theirs (`config: metadata`); None where the file has none; a ConfigError where it cannot be translated
    config_from_metadata: Callable | None = None
    # (frames, height, width) of the videos its pipelines make: the benchmark's compile-only rows
    native_video: tuple[int, int, int] = (81, 720, 1280)
    # state_dict entries whose values the manifest records (`tensors`): statistics pipelines read, such as LTX's
    # latents_mean / latents_std buffers
    recorded_tensors: tuple[str, ...] = ()
    # ({diffusers key: shape} of a file that brings no config, the named model's config) -> that config with what
    # the tensors show in place of the named model's (widths, depth, latent channels, optional layers); None where a
    # family's tensors cannot say
    config_from_shapes: Callable | None = None
    # an image model: its models take images, (B, C, H, W) channels-first and (B, H, W, C) in Flax, and its
    # validation shapes have no frame axis; a video model's take (B, C, T, H, W)
    image: bool = False

    @property
    def folder(self) -> str:
        """Its folder in models/, whose name its test file carries (tests/test_<folder>.py)."""
        return self.config_class.__module__.split(".")[-2]

    @property
    def class_name(self) -> str:
        """diffusers' class, as config.json's `_class_name` names it."""
        return self.config_class.class_name
