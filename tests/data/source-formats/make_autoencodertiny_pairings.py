"""Writes autoencodertiny-taesd.json beside this script: every key of madebyollin's original TAESD release, as
vae-convert reads its two files (taesd_encoder.*, taesd_decoder.*: each file's keys under its part's name), with its
shape and the diffusers key it becomes.

The original keys are those of the release's two `nn.Sequential`s as madebyollin/taesd's `taesd.py` lays them out
(encoder: a convolution, then per level a strided convolution without a bias and three blocks, one block in the
first level, then the output convolution; decoder: the Clamp at index 0, a convolution and a ReLU, then per level
three blocks, an upsampler and a convolution without a bias, the last level one block and the output convolution;
a block's parameters at `conv.0`, `conv.2`, `conv.4`). The pairing is diffusers' own: its
`scripts/convert_tiny_autoencoder_to_diffusers.py` (in the diffusers repository, not the wheel: pass its path) run on
files written with those keys, each tensor holding a value of its own; the checkpoint it saves says which diffusers
key each became, and it loads them into AutoencoderTiny strictly.

    .venv/bin/python tests/data/source-formats/make_autoencodertiny_pairings.py \
        PATH/TO/convert_tiny_autoencoder_to_diffusers.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
WIDTH, LATENT, RGB = 64, 4, 3


def block(prefix: str) -> dict[str, tuple]:
    return {f"{prefix}.conv.{i}.{p}": (WIDTH, WIDTH, 3, 3) if p == "weight" else (WIDTH,) for i in (0, 2, 4)
            for p in ("weight", "bias")}  # fmt: skip


def conv(prefix: str, out: int, inp: int, bias: bool) -> dict[str, tuple]:
    return {f"{prefix}.weight": (out, inp, 3, 3), **({f"{prefix}.bias": (out,)} if bias else {})}


def original_keys() -> tuple[dict, dict]:
    """{key: shape} of the released encoder and decoder files."""
    encoder, n = conv("0", WIDTH, RGB, True), 1
    for level, blocks in enumerate((1, 3, 3, 3)):
        if level:
            encoder.update(conv(str(n), WIDTH, WIDTH, False))
            n += 1
        for _ in range(blocks):
            encoder.update(block(str(n)))
            n += 1
    encoder.update(conv(str(n), LATENT, WIDTH, True))
    decoder, n = conv("1", WIDTH, LATENT, True), 3  # 0: Clamp, 2: ReLU
    for level, blocks in enumerate((3, 3, 3, 1)):
        for _ in range(blocks):
            decoder.update(block(str(n)))
            n += 1
        if level < 3:
            decoder.update(conv(str(n + 1), WIDTH, WIDTH, False))  # after the upsampler at n
            n += 2
    decoder.update(conv(str(n), RGB, WIDTH, True))
    return encoder, decoder


def main(script: Path):
    encoder, decoder = original_keys()
    tagged, values = {}, 0
    for part, keys in (("encoder", encoder), ("decoder", decoder)):
        tagged[part] = {}
        for key, shape in keys.items():
            tagged[part][key] = torch.full(shape, float(values))
            values += 1
    with tempfile.TemporaryDirectory() as tmp:
        paths = {part: Path(tmp) / f"taesd_{part}.safetensors" for part in tagged}
        for part, tensors in tagged.items():
            save_file(tensors, paths[part])
        subprocess.run(
            [sys.executable, str(script), "--encoder_ckpt_path", str(paths["encoder"]), "--decoder_ckpt_path",
             str(paths["decoder"]), "--dump_path", str(Path(tmp) / "out"), "--use_safetensors"],
            check=True,
        )  # fmt: skip
        converted = load_file(Path(tmp) / "out" / "diffusion_pytorch_model.safetensors")
    becomes = {int(v.flatten()[0]): k for k, v in converted.items()}
    assert len(becomes) == values == len(converted)  # every original tensor used once, every diffusers key made
    keys = {}
    for part, tensors in tagged.items():
        for key, tensor in tensors.items():
            keys[f"{part}.{key}"] = {"shape": list(tensor.shape), "diffusers": becomes[int(tensor.flatten()[0])]}
    pairing = {
        "file": "madebyollin's taesd_encoder.* and taesd_decoder.* (read as one release split by part)",
        "model_code": "madebyollin/taesd taesd.py Encoder and Decoder (nn.Sequential)",
        "pairing": "diffusers' scripts/convert_tiny_autoencoder_to_diffusers.py, run on the two files",
        "original_config": {"latent_channels": LATENT},
        "keys": keys,
    }
    (HERE / "autoencodertiny-taesd.json").write_text(json.dumps(pairing, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
