"""LTX-Video's original single files (`ltx-video-2b-v0.9*.safetensors`): the VAE config they carry in their
safetensors metadata (`config` -> `vae`, Lightricks' `CausalVideoAutoencoder` block-list format) translated to the
diffusers config, so a file says which layout it holds instead of the version being guessed from its keys.

Lightricks' encoder is a flat list of blocks: `res_x` (resnets at the current width), `res_x_y` (one resnet that
multiplies the width), `compress_all` (a strided convolution) or `compress_{space,time,all}_res` (space-to-depth
downsamplers that multiply the width); the decoder runs its list reversed, `compress_all` being a depth-to-space
upsampler (with `residual` and a width `multiplier`). diffusers groups them into levels: each `res_x` but the last
opens a level, what follows it up to the next `res_x` belongs to that level, the last `res_x` is the mid block."""

from __future__ import annotations

import json

from ..common.config import ConfigError

# The statistics the single files keep beside the VAE (diffusers keeps the first two as latents_mean/latents_std and
# drops the others)
STATISTICS = ("mean-of-means", "std-of-means", "mean-of-stds", "mean-of-stds_over_std-of-means", "channel")

_COMMON = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 128,
    "latent_log_var": "uniform",
    "norm_layer": "pixel_norm",
    "patch_size": 4,
    "scaling_factor": 1.0,
    "use_quant_conv": False,
    "causal_decoder": False,
}
# The published layouts' metadata configs: 0.9.0's and 0.9.5's as their safetensors headers hold them; 0.9.1's
# written from its diffusers config (the 0.9.0 encoder, a noise-injecting timestep-conditioned decoder), in the same
# vocabulary, as no copy of its header was found.
ORIGINAL_CONFIGS = {
    "0.9.0": {
        **_COMMON,
        "blocks": [
            ["res_x", 4],
            ["compress_all", 1],
            ["res_x_y", 1],
            ["res_x", 3],
            ["compress_all", 1],
            ["res_x_y", 1],
            ["res_x", 3],
            ["compress_all", 1],
            ["res_x", 3],
            ["res_x", 4],
        ],
    },
    "0.9.1": {
        **_COMMON,
        "encoder_blocks": [
            ["res_x", {"num_layers": 4}],
            ["compress_all", {}],
            ["res_x_y", {"multiplier": 2}],
            ["res_x", {"num_layers": 3}],
            ["compress_all", {}],
            ["res_x_y", {"multiplier": 2}],
            ["res_x", {"num_layers": 3}],
            ["compress_all", {}],
            ["res_x", {"num_layers": 3}],
            ["res_x", {"num_layers": 4}],
        ],
        "decoder_blocks": [
            ["res_x", {"num_layers": 5, "inject_noise": True}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 6, "inject_noise": True}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 7, "inject_noise": True}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 8, "inject_noise": False}],
        ],
        "timestep_conditioning": True,
    },
    "0.9.5": {
        **_COMMON,
        "encoder_blocks": [
            ["res_x", {"num_layers": 4}],
            ["compress_space_res", {"multiplier": 2}],
            ["res_x", {"num_layers": 6}],
            ["compress_time_res", {"multiplier": 2}],
            ["res_x", {"num_layers": 6}],
            ["compress_all_res", {"multiplier": 2}],
            ["res_x", {"num_layers": 2}],
            ["compress_all_res", {"multiplier": 2}],
            ["res_x", {"num_layers": 2}],
        ],
        "decoder_blocks": [
            ["res_x", {"num_layers": 5, "inject_noise": False}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 5, "inject_noise": False}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 5, "inject_noise": False}],
            ["compress_all", {"residual": True, "multiplier": 2}],
            ["res_x", {"num_layers": 5, "inject_noise": False}],
        ],
        "normalize_latent_channels": False,
        "timestep_conditioning": True,
    },
}

_SPACE_TO_DEPTH = {
    "compress_space_res": "spatial",
    "compress_time_res": "temporal",
    "compress_all_res": "spatiotemporal",
}


def _blocks(config: dict, key: str) -> list[tuple[str, dict]]:
    """A block list with its parameters as a dict ([name, n] is n layers)."""
    blocks = config.get(key, config.get("blocks"))
    if not isinstance(blocks, list) or not blocks:
        raise ConfigError(f"the VAE config in the file's metadata has no {key} (nor blocks)")
    out = []
    for entry in blocks:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise ConfigError(f"the VAE config in the file's metadata: {key} entry {entry!r} is not [name, params]")
        name, params = entry
        out.append((name, {"num_layers": params} if isinstance(params, int) else dict(params)))
    return out


def _levels(blocks: list[tuple[str, dict]], side: str) -> list[tuple[dict, list[tuple[str, dict]]]]:
    """(res_x params, the blocks after it up to the next res_x), in order; the last has none after it (mid block or
    last level)."""
    if blocks[0][0] != "res_x":
        raise ConfigError(
            f"the {side} blocks in the file's metadata do not start with res_x: no diffusers layout has that"
        )
    levels = []
    for name, params in blocks:
        if name == "res_x":
            levels.append((params, []))
        else:
            levels[-1][1].append((name, params))
    return levels


def _encoder(config: dict) -> dict:
    width = config.get("encoder_base_channels", 128)
    levels = _levels(_blocks(config, "encoder_blocks"), "encoder")
    *down, (mid, after) = levels
    if after:
        raise ConfigError(
            "the encoder blocks in the file's metadata end in a downsampler: no diffusers layout has that"
        )
    kinds = {name for _, extra in down for name, _ in extra}
    space_to_depth = bool(kinds & set(_SPACE_TO_DEPTH))
    if space_to_depth and kinds - set(_SPACE_TO_DEPTH) or not kinds <= {"compress_all", "res_x_y", *_SPACE_TO_DEPTH}:
        raise ConfigError(
            f"the encoder blocks in the file's metadata mix {sorted(kinds)}: no diffusers layout has that"
        )
    channels, layers, scaling, downsample = [width], [], [], []
    for params, extra in down:
        layers.append(params["num_layers"])
        names = [name for name, _ in extra]
        if space_to_depth:
            if len(extra) != 1:
                raise ConfigError("each 0.9.5-style encoder level has exactly one space-to-depth downsampler")
            name, p = extra[0]
            width *= p.get("multiplier", 2)
            downsample.append(_SPACE_TO_DEPTH[name])
            scaling.append(True)
        else:
            if names not in ([], ["compress_all"], ["res_x_y"], ["compress_all", "res_x_y"]):
                raise ConfigError(f"an encoder level of {names} has no diffusers layout")
            scaling.append("compress_all" in names)
            downsample.append("conv")
            for name, p in extra:
                if name == "res_x_y":
                    width *= p.get("multiplier", 2)
        channels.append(width)
    layers.append(mid["num_layers"])
    out = {"layers_per_block": layers, "spatio_temporal_scaling": scaling}
    if space_to_depth:
        spatial = config.get("patch_size", 1) * 2 ** sum(d != "temporal" for d in downsample)
        temporal = 2 ** sum(d != "spatial" for d in downsample)
        out.update(
            block_out_channels=channels,
            down_block_types=["LTXVideo095DownBlock3D"] * len(down),
            downsample_type=downsample,
            spatial_compression_ratio=spatial,
            temporal_compression_ratio=temporal,
        )
    else:
        # diffusers' 0.9.0 levels: the width each level runs at; its last level cannot change the width
        if channels[-1] != channels[-2]:
            raise ConfigError(
                "the last encoder level in the file's metadata changes the width: no diffusers layout has that"
            )
        out.update(block_out_channels=channels[:-1], down_block_types=["LTXVideoDownBlock3D"] * len(down))
    return out


def _decoder(config: dict) -> dict:
    blocks = list(reversed(_blocks(config, "decoder_blocks")))
    levels = _levels(blocks, "decoder")
    (mid, after_mid), *rest = levels
    # what precedes each level's res_x in the reversed list: the mid block's followers open the first level
    groups, pending = [], after_mid
    for params, extra in rest:
        groups.append((pending, params))
        pending = extra
    if pending:
        raise ConfigError(
            "the decoder blocks in the file's metadata start with an upsampler: no diffusers layout has that"
        )
    width = config.get("decoder_base_channels", 128)
    for name, params in blocks:
        if name == "res_x_y":
            width *= params.get("multiplier", 2)
        elif name.startswith("compress"):
            width *= params.get("multiplier", 1)
    channels, layers, scaling, residual, factor, noise = (
        [],
        [mid["num_layers"]],
        [],
        [],
        [],
        [mid.get("inject_noise", False)],
    )
    for before, params in groups:
        names = [name for name, _ in before]
        if names not in ([], ["compress_all"], ["res_x_y"], ["res_x_y", "compress_all"]):
            raise ConfigError(f"a decoder level of {names} has no diffusers layout")
        level_factor = 1
        for name, p in before:
            if name == "res_x_y":
                if p.get("inject_noise"):
                    raise ConfigError("noise in a decoder resnet that changes width has no diffusers layout")
                width //= p.get("multiplier", 2)
            else:
                level_factor = p.get("multiplier", 1)
                width //= level_factor
                residual.append(p.get("residual", False))
        if "compress_all" not in names:
            residual.append(False)
        scaling.append("compress_all" in names)
        factor.append(level_factor)
        channels.append(width * level_factor)
        layers.append(params["num_layers"])
        noise.append(params.get("inject_noise", False))
    return {
        "decoder_block_out_channels": channels[::-1],
        "decoder_layers_per_block": layers[::-1],
        "decoder_spatio_temporal_scaling": scaling[::-1],
        "decoder_inject_noise": noise[::-1],
        "upsample_residual": residual[::-1],
        "upsample_factor": factor[::-1],
    }


def diffusers_config(original: dict) -> dict:
    """The `AutoencoderKLLTXVideo` config of a file's metadata VAE config, or a ConfigError saying what has no
    diffusers equivalent."""
    for key, supported in (("norm_layer", "pixel_norm"), ("latent_log_var", "uniform"), ("use_quant_conv", False)):
        if original.get(key, supported) != supported:
            raise ConfigError(
                f"the VAE config in the file's metadata has {key} {original[key]!r}: diffusers' class takes "
                f"{supported!r} only"
            )
    if original.get("dims", 3) != 3:
        raise ConfigError("the VAE config in the file's metadata is not a video (3-d) VAE")
    return {
        "in_channels": original.get("in_channels", 3),
        "out_channels": original.get("out_channels", 3),
        "latent_channels": original["latent_channels"],
        "patch_size": original.get("patch_size", 1),
        "scaling_factor": original.get("scaling_factor", 1.0),
        "encoder_causal": True,
        "decoder_causal": original.get("causal_decoder", False),
        "timestep_conditioning": original.get("timestep_conditioning", False),
        **_encoder(original),
        **_decoder(original),
    }


def config_from_metadata(metadata: dict) -> dict | None:
    """The diffusers config of a single file's safetensors metadata (`config`: JSON whose `vae` is the VAE's), None
    where it carries none."""
    if "config" not in metadata:
        return None
    try:
        vae = json.loads(metadata["config"]).get("vae")
    except (ValueError, RecursionError, AttributeError):
        raise ConfigError("the file's metadata config is not a JSON object") from None
    if not isinstance(vae, dict):
        raise ConfigError("the file's metadata config has no VAE config (its 'vae')")
    try:
        return diffusers_config(vae)
    except ConfigError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of another type or missing
        raise ConfigError(f"the VAE config in the file's metadata is malformed ({type(e).__name__}: {e})") from None
