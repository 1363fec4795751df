"""A pipeline's audio decode side at full size: the audio VAE's decode of a latent, then the vocoder's waveform of
that mel spectrogram, as LTX-2's pipelines chain them:

    python -m bench.audio                   # LTX-2.3: 10 s of audio (250 latent frames) to 48 kHz stereo
    python -m bench.audio ltx-2 --seconds 4

Random weights of the real architectures (`vae-convert random-checkpoint`, one per component in a pipeline folder),
each component converted by a whole process (imports included, no validation: the conversion as users time it),
then the chained decode by Flax, torchax and diffusers eager, in float32, taking turns in one process: each round
calls each implementation twice and times the second, starting with the next one each round; the best of the rounds
is reported, the first call (compiling) beside it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

from bench import diffusers_class_of, diffusers_decode
from bench.run import REPO, _cpu, _seconds_of, _vae_convert

LATENT_FRAMES_PER_SECOND = 25  # LTX-2's audio latents: 16 kHz / 160 samples a mel frame / 4 mel frames a latent
ROUNDS = 3


def _chains(outputs: dict, folder: Path) -> dict:
    """{implementation: a call of the audio VAE's decode then the vocoder, numpy in and out}."""
    import torch

    import converter
    from converter.targets import TARGETS

    chains = {}
    for target, out in outputs.items():
        audio_vae = TARGETS[target].runner(converter.load(out / "audio_vae"))
        vocoder = TARGETS[target].runner(converter.load(out / "vocoder"))
        chains[target] = lambda z, a=audio_vae, v=vocoder: v.decode(a.decode(z))
    models = {c: diffusers_class_of(folder / c).from_pretrained(folder / c).eval() for c in ("audio_vae", "vocoder")}

    def diffusers(z):
        with torch.no_grad():
            mel = diffusers_decode(models["audio_vae"], torch.from_numpy(z))
            return diffusers_decode(models["vocoder"], mel).numpy()

    chains["diffusers"] = diffusers
    return chains


def measure(model: str, seconds: float, work: Path) -> dict:
    from converter.registry import get_models

    entries = get_models(model, "all")
    folder = work / "pipeline"
    for entry in entries:
        if entry.component != "vae":  # the audio side only
            _vae_convert("random-checkpoint", entry.qualified, folder / entry.component)
    audio_vae = next(e for e in entries if e.component == "audio_vae")
    config = json.loads((folder / "audio_vae" / "config.json").read_text())
    frames = round(seconds * LATENT_FRAMES_PER_SECOND)
    latent = (
        np.random.default_rng(0)
        .standard_normal((1, config["latent_channels"], frames, (config["mel_bins"] or 64) // 4))
        .astype(np.float32)
    )
    result = {"latent": list(latent.shape), "convert whole process": {}, "decode": {}}
    outputs = {}
    for target in ("flax", "torchax"):
        outputs[target] = work / target
        args = ("--source", folder, "--to", target, "--no-validate")
        result["convert whole process"][target] = sum(
            _seconds_of(partial(_vae_convert, audio_vae.name, "--component", c, *args, "--out", outputs[target] / c))
            for c in ("audio_vae", "vocoder")
        )
    chains = _chains(outputs, folder)
    impls = list(chains)
    for impl, chain in chains.items():
        started = time.perf_counter()
        waveform = chain(latent)
        result["decode"][impl] = {"first": time.perf_counter() - started, "steady": float("inf")}
    result["waveform"] = list(waveform.shape)
    for r in range(ROUNDS):
        for impl in impls[r % len(impls) :] + impls[: r % len(impls)]:
            chains[impl](latent)
            started = time.perf_counter()
            chains[impl](latent)
            result["decode"][impl]["steady"] = min(result["decode"][impl]["steady"], time.perf_counter() - started)
    return result


def markdown(model: str, result: dict, machine: str) -> str:
    shape = "x".join(map(str, result["latent"]))
    lines = [
        f"{model}: audio VAE + vocoder decode of a {shape} latent to a {'x'.join(map(str, result['waveform']))} "
        f"waveform, float32, {machine}",
        "",
        "| implementation | first call | steady | conversion (whole process, both components) |",
        "|---|---|---|---|",
    ]
    for impl, timing in result["decode"].items():
        convert = result["convert whole process"].get(impl)
        lines.append(
            f"| {impl} | {timing['first']:.2f} s | {timing['steady']:.2f} s | "
            f"{f'{convert:.1f} s' if convert else '-'} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="ltx-2.3")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = measure(args.model, args.seconds, Path(work))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.model}-audio.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(args.model, result, _cpu().strip())
    (args.out / f"{args.model}-audio.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
