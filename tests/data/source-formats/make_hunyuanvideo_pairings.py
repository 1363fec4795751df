"""Writes hunyuanvideo-original.json beside this script: every key of Tencent's HunyuanVideo VAE release file
(hunyuan-video-t2v-720p/vae/pytorch_model.pt, its tensors under `state_dict`), with its shape and the diffusers key it
becomes. The original keys come from Tencent's own model code (`AutoencoderKLCausal3D`, hyvideo/vae in the
Tencent-Hunyuan/HunyuanVideo repository) built on the meta device from the release's config.json; diffusers' converter
(scripts/convert_hunyuan_video_to_diffusers.py) loads them unrenamed (its VAE rename table is empty), which this script
checks: the keys and shapes equal those of diffusers' AutoencoderKLHunyuanVideo. With hyvideo's folder and einops on
the path:

    PYTHONPATH=/path/to/HunyuanVideo:/path/to/einops \\
        .venv/bin/python tests/data/source-formats/make_hunyuanvideo_pairings.py
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import diffusers
import torch

HERE = Path(__file__).resolve().parent
# the release's hunyuan-video-t2v-720p/vae/config.json
RELEASE_CONFIG = {
    "_class_name": "AutoencoderKLCausal3D",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlockCausal3D"] * 4,
    "in_channels": 3,
    "latent_channels": 16,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 256,
    "sample_tsize": 64,
    "up_block_types": ["UpDecoderBlockCausal3D"] * 4,
    "scaling_factor": 0.476986,
    "time_compression_ratio": 4,
    "mid_block_add_attention": True,
}


def original_model_class():
    """hyvideo.vae's model without hyvideo's package imports (which load the whole video pipeline)."""
    root = next(Path(p) / "hyvideo" for p in sys.path if (Path(p) / "hyvideo" / "vae").is_dir())
    for name, folder in (("hyvideo", root), ("hyvideo.vae", root / "vae")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    from hyvideo.vae.autoencoder_kl_causal_3d import AutoencoderKLCausal3D

    return AutoencoderKLCausal3D


if __name__ == "__main__":
    with torch.device("meta"):
        original = original_model_class().from_config(RELEASE_CONFIG).state_dict()
        expected = diffusers.AutoencoderKLHunyuanVideo().state_dict()
    assert {k: v.shape for k, v in original.items()} == {k: v.shape for k, v in expected.items()}
    content = {
        "file": "HunyuanVideo VAE release file (hunyuan-video-t2v-720p/vae/pytorch_model.pt), under 'state_dict'",
        "model_code": "Tencent-Hunyuan/HunyuanVideo: hyvideo/vae/autoencoder_kl_causal_3d.py (AutoencoderKLCausal3D)",
        "pairing": "diffusers' scripts/convert_hunyuan_video_to_diffusers.py: no VAE key renamed",
        "original_config": RELEASE_CONFIG,
        "keys": {k: {"shape": list(v.shape), "diffusers": k} for k, v in original.items()},
    }
    (HERE / "hunyuanvideo-original.json").write_text(json.dumps(content, indent=1) + "\n")
    print(f"hunyuanvideo-original.json: {len(content['keys'])} keys")
