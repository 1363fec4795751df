"""`vae-convert random-checkpoint`: writes a diffusers-format checkpoint with random weights, for offline demos and
tests. It uses the project's PyTorch model (diffusers' names and layouts), so no Hub access and no diffusers install;
the folder appears whole or not at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from converter.errors import OutputError
from converter.output import OutputFolder
from converter.registry import ModelEntry, config_from_dict, small_config
from converter.safetensors_io import SafetensorsWriter
from converter.sources import WEIGHTS_NAME


def keep_inside_the_clamp(model, family):
    """Scales the last convolution of a model whose decode clamps to [-1, 1] so that random weights decode to values
    inside the clamp, where a wrong value cannot hide behind saturation (and bfloat16's error shows)."""
    if family.clamps_output:
        for name, weight in model.named_parameters():
            if name.endswith("conv_out.weight") and not name.startswith("encoder."):
                weight.data.mul_(0.03)


def write_random_checkpoint(entry: ModelEntry, out: Path, small: bool, seed: int = 0) -> int:
    """Writes the checkpoint (the family's small widths with `small`); returns its number of parameters."""
    import torch

    family = entry.family
    config = config_from_dict(family, {**entry.config, **small_config(entry)} if small else entry.config)
    folder = OutputFolder(out, force=False)
    if os.path.lexists(folder.out):
        raise OutputError(f"{folder.out} exists{' (a symbolic link)' * folder.out.is_symlink()}; choose a new folder")
    torch.manual_seed(seed)
    model = family.torch_model()(config)
    with torch.no_grad():
        for buffer in model.buffers():  # one its init leaves to the checkpoint (a vocoder's filters, mel basis)
            if buffer.is_floating_point() and not buffer.any():
                buffer.normal_(0.0, 0.1)
        keep_inside_the_clamp(model, family)
    state = model.state_dict()
    with folder as work:
        try:
            specs = {k: (tuple(v.shape), np.dtype(str(v.dtype).removeprefix("torch."))) for k, v in state.items()}
            writer = SafetensorsWriter(work / WEIGHTS_NAME, specs, {"format": "pt"})
            for key, tensor in state.items():
                writer.write(key, tensor.numpy())
            writer.close()
            (work / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        except OSError as e:
            raise OutputError(f"cannot write to {folder.out.parent}: {e.strerror or e}") from None
        folder.commit()
    return sum(v.numel() for v in state.values())
