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
    """One diffusers class as the converter, the tests and the benchmark know it (models/common/protocol.py says what
    its models keep to)."""

    name: str
    config_class: type[DiffusersConfig]
    # The two implementations, imported on demand so that the CLI starts without Flax or the model code.
    flax_model: Callable[[], type]
    torch_model: Callable[[], type]
    testing: Callable[[], FamilyTesting]  # its test data (models/common/testing.py), imported on demand too
    mapping_file: str  # in mappings/
    models: tuple[ModelName, ...]
    # (config) -> shapes of the validation inputs, channels-first and of the rank diffusers' class takes: the latent
    # its validation decodes, and the sample (a video, an image) it encodes to a latent of the same sizes, so decoding
    # that encoding (for validation.png) reuses the compiled steps. Their sizes must not grow with the config beyond
    # what its released models have (converter/validate.py bounds them). A decoder alone (a vocoder) has no sample
    # (None); its "latent" is what it decodes (a mel spectrogram)
    validation_latent_shape: Callable
    validation_sample_shape: Callable | None
    # (config) -> the extra inputs validation decodes with, {diffusers' keyword: array over the validation batch}:
    # fixed values, which the report and the manifest name (a timestep for a timestep-conditioned decoder); None
    # where decode takes latents only
    validation_decode_inputs: Callable | None = None
    clamps_output: bool = False  # whether decode clamps to [-1, 1], as diffusers' model does
    # (safetensors header metadata) -> the diffusers config an original file carries, for formats whose files keep
    # theirs (`config: metadata`); None where the file has none; a ConfigError where it cannot be translated
    config_from_metadata: Callable | None = None
    # the sizes (no batch, no channels) of the samples its pipelines make, in the order of the validation sample's
    # axes: (frames, height, width) of a video, (height, width) of an image; the benchmark's compile-only rows
    native_size: tuple[int, ...] = (81, 720, 1280)
    # state_dict entries whose values the manifest records (`tensors`): statistics pipelines read, such as LTX's
    # latents_mean / latents_std buffers
    recorded_tensors: tuple[str, ...] = ()
    # ({diffusers key: shape} of a file that brings no config, the named model's config) -> that config with what
    # the tensors show in place of the named model's (widths, depth, latent channels, optional layers); None where a
    # family's tensors cannot say
    config_from_shapes: Callable | None = None
    # whether its samples have a frame axis, which its parts run in chunks (a video's (B, C, T, H, W); an image
    # class that takes one frame keeps it); False: an image (B, C, H, W), its parts run whole
    frame_axis: bool = True
    # the parts its models have, which validation, tiling, meshes, the benchmark and `info` ask for: an autoencoder's
    # encoder and decoder, or a decoder only
    parts: tuple[str, ...] = ("encoder", "decoder")
    # what `encode` gives, as diffusers' encode output holds it: its latent distribution's mean and log-variance, or a
    # deterministic encoder's latents (models/common/outputs.py `encoded`)
    encode_outputs: tuple[str, ...] = ("mean", "logvar")
    # the pipeline component its class is (diffusers' model_index key, its models' Hub subfolder by default): the
    # VAE, LTX-2's audio VAE, a vocoder
    component: str = "vae"
    # the diffusers module that defines the class (the tests' oracle and the benchmark's): the package itself for its
    # models, a pipeline's module for a class kept beside its pipeline (LTX-2's vocoders)
    diffusers_module: str = "diffusers"
    # (config) -> the sample rate in Hz of the waveforms it decodes to (validation.wav); None where it decodes no sound
    sample_rate: Callable | None = None
    # diffusers' `_keep_in_fp32_modules`: the leaves under a module of one of these names (a component of the leaf's
    # dotted name, as diffusers matches them) stay float32 in an output of any dtype, and compute in float32
    keep_in_float32: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        """Its folder in models/, whose name its test file carries (tests/test_<folder>.py)."""
        return self.config_class.__module__.split(".")[-2]

    def diffusers_class(self) -> type:
        """diffusers' class (imports diffusers: for the tests and the benchmark, never the converter)."""
        return getattr(importlib.import_module(self.diffusers_module), self.class_name)

    @property
    def class_name(self) -> str:
        """diffusers' class, as config.json's `_class_name` names it."""
        return self.config_class.class_name
