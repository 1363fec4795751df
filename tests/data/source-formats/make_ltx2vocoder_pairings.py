"""Writes ltx2vocoder-ltx-2.json and ltx2vocoderbwe-ltx-2.3.json beside this script: every key of the vocoder in
Lightricks' LTX-2.0 and LTX-2.3 single files (under `vocoder.`, the original code's names), with its shape and the
diffusers key it becomes.

The original keys are diffusers' keys at the released configs with the original names put back (conv_pre,
conv_post, ups, resblocks; in 2.3 also act_post and the anti-aliased activations' downsample.lowpass). The pairing
is diffusers' own: `convert_ltx2_vocoder` of `scripts/convert_ltx2_to_diffusers.py` (in the diffusers repository,
not the wheel: pass its path), with the rename tables and handlers it uses, taken from the script by name and run on
those keys, each tensor holding a value of its own; it loads them into LTX2Vocoder or LTX2VocoderWithBWE strictly,
and its output says which diffusers key each became.

    .venv/bin/python tests/data/source-formats/make_ltx2vocoder_pairings.py PATH/TO/convert_ltx2_to_diffusers.py
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

HERE = Path(__file__).resolve().parent
TAKEN = (
    "LTX_2_0_VOCODER_RENAME_DICT", "LTX_2_3_VOCODER_RENAME_DICT", "convert_ltx2_3_vocoder_upsamplers",
    "LTX_2_0_VOCODER_SPECIAL_KEYS_REMAP", "LTX_2_3_VOCODER_SPECIAL_KEYS_REMAP", "update_state_dict_inplace",
    "get_ltx2_vocoder_config", "convert_ltx2_vocoder",
)  # fmt: skip


def script_functions(path: Path) -> dict:
    """The script's definitions named in TAKEN, run without its imports (transformers and the pipelines)."""
    tree = ast.parse(path.read_text())
    body = [
        node for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.Assign))
        and (node.name if isinstance(node, ast.FunctionDef) else node.targets[0].id) in TAKEN
    ]  # fmt: skip
    scope = {
        "Any": Any, "LTX2Vocoder": LTX2Vocoder, "LTX2VocoderWithBWE": LTX2VocoderWithBWE,
        "init_empty_weights": contextlib.nullcontext,
    }  # fmt: skip
    exec(compile(ast.Module(body, []), str(path), "exec"), scope)
    return scope


def original_key(key: str, version: str) -> str:
    """diffusers' key with the original code's names back."""
    key = re.sub(r"(^|\.)conv_in\.", r"\1conv_pre.", key)
    key = re.sub(r"(^|\.)conv_out\.", r"\1conv_post.", key)
    key = re.sub(r"(^|\.)upsamplers\.", r"\1ups.", key)
    key = re.sub(r"(^|\.)resnets\.", r"\1resblocks.", key)
    if version == "2.3":
        key = key.replace("act_out.", "act_post.").replace("downsample.filter", "downsample.lowpass.filter")
    return key


def write(script: dict, version: str, cls, name: str, file: str):
    with torch.device("meta"):
        expected = cls().state_dict()
    original = {
        original_key(key, version): torch.full(tuple(tensor.shape), float(i))
        for i, (key, tensor) in enumerate(expected.items())
    }
    converted = script["convert_ltx2_vocoder"](dict(original), version).state_dict()
    becomes = {int(v.flatten()[0]): k for k, v in converted.items()}
    assert len(becomes) == len(original) == len(expected)  # every original tensor used once
    pairing = {
        "file": file,
        "model_code": f"diffusers {cls.__name__} at the released config (convert_ltx2_vocoder's, version {version})",
        "pairing": "diffusers' convert_ltx2_vocoder (scripts/convert_ltx2_to_diffusers.py)",
        "keys": {
            "vocoder." + k: {"shape": list(v.shape), "diffusers": becomes[int(v.flatten()[0])]}
            for k, v in original.items()
        },
    }
    (HERE / name).write_text(json.dumps(pairing, indent=1) + "\n")


def main():
    script = script_functions(Path(sys.argv[1]))
    write(script, "2.0", LTX2Vocoder, "ltx2vocoder-ltx-2.json",
          "the vocoder of Lightricks' LTX-2.0 single files (ltx-2-19b-dev.safetensors)")  # fmt: skip
    write(script, "2.3", LTX2VocoderWithBWE, "ltx2vocoderbwe-ltx-2.3.json",
          "the vocoder of Lightricks' LTX-2.3 single files (ltx-2.3-22b-dev.safetensors)")  # fmt: skip


if __name__ == "__main__":
    main()
