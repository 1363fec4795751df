"""Original release files as tests write them: a diffusers state_dict renamed with the pairings in
tests/data/source-formats/ (the oracle for keys), pickled as released;
and the comparison of two outputs' tensors."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors.torch import save_file

from converter.mapping import MAPPINGS_DIR, load_mapping
from converter.output import read_output
from converter.sources import SPLIT_PARTS
from tests.helpers import PAIRINGS, family_cases, small

# Each family's original formats as its test data writes them (models/<family>/testing.py): by format, (family,
# OriginalFileCase). The validation decode/encode runs for one target per format (it checks the reference sees the
# renamed weights); the other target's output is proven by equality with the diffusers checkpoint's conversion.
FORMATS = {fmt: (family, case) for family, fmt, case in family_cases(lambda testing: testing.original_files).values()}


def released_config(fmt: str) -> tuple[str, dict]:
    """The model name and small config (with the released block structure) a format's test file is written for."""
    family, case = FORMATS[fmt]
    name, config = small(family, case.small)
    return name, {**config, **case.config_changes}


def pairing(fmt: str, family=None) -> dict[str, tuple[str, int]]:
    """original key -> (diffusers key, the original tensor's rank), as the pairings file of `family`'s format lists
    them (by default the family whose test data writes that format)."""
    family = family or FORMATS[fmt][0]
    keys = json.loads((PAIRINGS / load_mapping(MAPPINGS_DIR / family.mapping_file).formats[fmt].pairings).read_text())[
        "keys"
    ]
    return {original: (entry["diffusers"], len(entry["shape"])) for original, entry in keys.items()}


def as_released(state: dict, fmt: str, family=None) -> dict:
    """The diffusers tensors under their original names, each of the rank it is released with (LDM keeps its
    attention projections as 1x1 convolutions: trailing axes of one)."""
    return {
        original: state[key].clone().reshape(*state[key].shape, *(1,) * (rank - state[key].ndim))
        for original, (key, rank) in pairing(fmt, family).items()
    }


def write_original(state: dict, fmt: str, path, wrapper=FORMATS, extra=None):
    """The diffusers state_dict renamed as the original file has it, written as it is released: a `.safetensors`
    file, or pickled (SAT: wrapped, with training-discriminator tensors beside the model's); a release split by part
    as one file per part, named after `path` (returned: the first part's file, which brings the others)."""
    tensors = {**as_released(state, fmt), **(extra or {})}
    wrapper = FORMATS[fmt][1].wrapper if wrapper is FORMATS else wrapper
    path.parent.mkdir(parents=True, exist_ok=True)
    if not FORMATS[fmt][1].split_by_part:
        _write(tensors, path, wrapper)
        return path
    files = {part: path.with_name(f"{path.stem}_{part}{path.suffix}") for part in SPLIT_PARTS}
    for part, file in files.items():
        _write({k.removeprefix(f"{part}."): v for k, v in tensors.items() if k.startswith(f"{part}.")}, file, wrapper)
    return files[SPLIT_PARTS[0]]


def _write(tensors: dict, path, wrapper):
    if path.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    else:
        torch.save({wrapper: tensors} if wrapper else tensors, path)


def as_converted_by_diffusers(model, fmt: str):
    """`model` as diffusers' converter makes it of a file of `fmt`: a count such files lack (the format's
    `filled`) holds the value diffusers' loader gives it."""
    family = FORMATS[fmt][0]
    with torch.no_grad():
        for key, value in load_mapping(MAPPINGS_DIR / family.mapping_file).formats[fmt].filled.items():
            model.get_buffer(key).fill_(value)
    return model


def output_tensors(out) -> dict[str, np.ndarray]:
    info = read_output(out)
    weights = info.target.read_weights(info)
    return {str(k): np.asarray(v) for k, v in weights.items()}


def assert_same_tensors(got: dict, expected: dict):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and np.array_equal(got[key], value), key
