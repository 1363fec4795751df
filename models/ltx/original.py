"""LTX's original single files (LTX-Video's `ltx-video-2b-v0.9*.safetensors`, LTX-2's `ltx-2*.safetensors`): the
VAE config they carry in their safetensors metadata (`config` -> `vae`, Lightricks' `CausalVideoAutoencoder`
block-list format, the same vocabulary in both generations) translated to the diffusers config of the family's
class, so a file says which layout it holds instead of the version being guessed from its keys.

Lightricks' encoder is a flat list of blocks: `res_x` (resnets at the current width), `res_x_y` (one resnet that
multiplies the width), `compress_all` (a strided convolution) or `compress_{space,time,all}_res` (space-to-depth
downsamplers that multiply the width); the decoder runs its list reversed, `compress_all` being a depth-to-space
upsampler (with `residual` and a width `multiplier`; LTX-2 adds `compress_time` and `compress_space`). diffusers
groups them into levels: each `res_x` but the last opens a level, what follows it up to the next `res_x` belongs to
that level, the last `res_x` is the mid block. LTX-2 (Lightricks' ltx-core) reads the same lists with other
defaults: the encoder's first width is the latent width, the decoder pads by reflection and is timestep-conditioned
unless the config says otherwise."""

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


def _ltx2_blocks(down_layers, downsamplers, up_layers, upsamplers) -> dict:
    """LTX-2's block lists: res_x levels with a downsampler (name, multiplier) after each but the last; the decoder
    list in file order (the output end first), an upsampler (name, params) between its res_x levels."""
    encoder = []
    for layers, downsampler in zip(down_layers, [*downsamplers, None]):
        encoder.append(["res_x", {"num_layers": layers}])
        if downsampler:
            encoder.append([downsampler[0], {"multiplier": downsampler[1]}])
    decoder = []
    for layers, upsampler in zip(up_layers, [*upsamplers, None]):
        decoder.append(["res_x", {"num_layers": layers, "inject_noise": False}])
        if upsampler:
            decoder.append(list(upsampler))
    return {"encoder_blocks": encoder, "decoder_blocks": decoder}


_LTX2_COMMON = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 128,
    "patch_size": 4,
    "norm_layer": "pixel_norm",
    "latent_log_var": "uniform",
    "use_quant_conv": False,
    "normalize_latent_channels": False,
    "causal_decoder": False,
    "timestep_conditioning": False,
    "decoder_base_channels": 128,
    "scaling_factor": 1.0,
}
# LTX-2's layouts in ltx-core's vocabulary, written from diffusers' configs for them (no copy of a header was found):
# 2.0 (its decoder pads by reflection, ltx-core's default) and 2.3 (zero padding, temporal-only and spatial-only
# upsamplers, a level that keeps its width)
LTX2_ORIGINAL_CONFIGS = {
    "2.0": {
        **_LTX2_COMMON,
        "encoder_spatial_padding_mode": "zeros",
        **_ltx2_blocks(
            [4, 6, 6, 2, 2],
            [("compress_space_res", 2), ("compress_time_res", 2), ("compress_all_res", 2), ("compress_all_res", 2)],
            [5, 5, 5, 5],
            [["compress_all", {"residual": True, "multiplier": 2}]] * 3,
        ),
    },
    "2.3": {
        **_LTX2_COMMON,
        "spatial_padding_mode": "zeros",
        **_ltx2_blocks(
            [4, 6, 4, 2, 2],
            [("compress_space_res", 2), ("compress_time_res", 2), ("compress_all_res", 2), ("compress_all_res", 1)],
            [4, 6, 4, 2, 2],
            [
                ["compress_space", {"multiplier": 2}],
                ["compress_time", {"multiplier": 2}],
                ["compress_all", {"multiplier": 1}],
                ["compress_all", {"multiplier": 2}],
            ],
        ),
    },
}

_SPACE_TO_DEPTH = {
    "compress_space_res": "spatial",
    "compress_time_res": "temporal",
    "compress_all_res": "spatiotemporal",
}
_DEPTH_TO_SPACE = {"compress_all": "spatiotemporal", "compress_time": "temporal", "compress_space": "spatial"}


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
        params = {"num_layers": params} if isinstance(params, int) else dict(params)
        for field, least in (("num_layers", 0), ("multiplier", 1)):
            _whole(params, field, least, f"{key} entry {name!r}")
        out.append((name, params))
    return out


def _whole(fields: dict, name: str, least: int, where: str):
    """A width, a count or a factor the translation computes with must be a whole number (not a string that `*`
    would repeat, nor a zero that `//` would divide by)."""
    value = fields.get(name, least)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(
            f"the VAE config in the file's metadata: {where} has {name} {value!r}, expected a whole number >= {least}"
        )


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


def _encoder(config: dict, ltx2: bool) -> dict:
    # ltx-core's encoder starts at the latent width; LTX-Video's at its base width
    width = config["latent_channels"] if ltx2 else config.get("encoder_base_channels", 128)
    levels = _levels(_blocks(config, "encoder_blocks"), "encoder")
    *down, (mid, after) = levels
    if after:
        raise ConfigError(
            "the encoder blocks in the file's metadata end in a downsampler: no diffusers layout has that"
        )
    kinds = {name for _, extra in down for name, _ in extra}
    space_to_depth = bool(kinds & set(_SPACE_TO_DEPTH)) or ltx2
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
                raise ConfigError("each space-to-depth encoder level has exactly one space-to-depth downsampler")
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
            # LTX-2 counts the widths after each downsampler, LTX-Video 0.9.5 from conv_in's
            block_out_channels=channels[1:] if ltx2 else channels,
            down_block_types=["LTX2VideoDownBlock3D" if ltx2 else "LTXVideo095DownBlock3D"] * len(down),
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


def _decoder(config: dict, ltx2: bool) -> dict:
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
    upsamplers = set(_DEPTH_TO_SPACE) if ltx2 else {"compress_all"}
    width = config.get("decoder_base_channels", 128)
    for name, params in blocks:
        if name == "res_x_y":
            width *= params.get("multiplier", 2)
        elif name.startswith("compress"):
            width *= params.get("multiplier", 1)
    channels, layers, scaling, residual, factor, kinds, noise = (
        [],
        [mid["num_layers"]],
        [],
        [],
        [],
        [],
        [mid.get("inject_noise", False)],
    )
    for before, params in groups:
        names = [name for name, _ in before]
        upsampler = [name for name in names if name != "res_x_y"]
        if (
            names not in ([], upsampler, ["res_x_y"], ["res_x_y", *upsampler])
            or len(upsampler) > 1
            or (upsampler and upsampler[0] not in upsamplers)
        ):
            raise ConfigError(f"a decoder level of {names} has no diffusers layout")
        level_factor, level_residual = 1, False
        for name, p in before:
            if name == "res_x_y":
                if p.get("inject_noise"):
                    raise ConfigError("noise in a decoder resnet that changes width has no diffusers layout")
                width //= p.get("multiplier", 2)
            else:
                level_factor = p.get("multiplier", 1)
                width //= level_factor
                # ltx-core builds only compress_all with a residual path
                level_residual = name == "compress_all" and p.get("residual", False)
        residual.append(level_residual)
        scaling.append(bool(upsampler))
        kinds.append(_DEPTH_TO_SPACE[upsampler[0]] if upsampler else "spatiotemporal")
        factor.append(level_factor)
        channels.append(width * level_factor)
        layers.append(params["num_layers"])
        noise.append(params.get("inject_noise", False))
    out = {
        "decoder_block_out_channels": channels[::-1],
        "decoder_layers_per_block": layers[::-1],
        "decoder_spatio_temporal_scaling": scaling[::-1],
        "decoder_inject_noise": noise[::-1],
        "upsample_residual": residual[::-1],
        "upsample_factor": factor[::-1],
    }
    if ltx2:
        out["upsample_type"] = kinds  # diffusers reads this list in the decoder's order, not reversed
    return out


def _refuse_unsupported(original: dict):
    for key, supported in (("norm_layer", "pixel_norm"), ("latent_log_var", "uniform"), ("use_quant_conv", False)):
        if original.get(key, supported) != supported:
            raise ConfigError(
                f"the VAE config in the file's metadata has {key} {original[key]!r}: diffusers' class takes "
                f"{supported!r} only"
            )
    if original.get("dims", 3) != 3:
        raise ConfigError("the VAE config in the file's metadata is not a video (3-d) VAE")
    for name in ("in_channels", "out_channels", "latent_channels", "patch_size", "encoder_base_channels",
                 "decoder_base_channels"):  # fmt: skip
        _whole(original, name, 1, "the config")


def _shared(original: dict) -> dict:
    return {
        "in_channels": original.get("in_channels", 3),
        "out_channels": original.get("out_channels", 3),
        "latent_channels": original["latent_channels"],
        "scaling_factor": original.get("scaling_factor", 1.0),
        "encoder_causal": True,
        "decoder_causal": original.get("causal_decoder", False),
    }


def ltx_video_config(original: dict) -> dict:
    """The `AutoencoderKLLTXVideo` config of an LTX-Video file's metadata VAE config, or a ConfigError saying what
    has no diffusers equivalent."""
    _refuse_unsupported(original)
    return {
        **_shared(original),
        "patch_size": original.get("patch_size", 1),
        "timestep_conditioning": original.get("timestep_conditioning", False),
        **_encoder(original, ltx2=False),
        **_decoder(original, ltx2=False),
    }


def ltx2_config(original: dict) -> dict:
    """The `AutoencoderKLLTX2Video` config of an LTX-2 file's metadata VAE config, with ltx-core's defaults."""
    _refuse_unsupported(original)
    if original.get("_class_name", "CausalVideoAutoencoder") != "CausalVideoAutoencoder":
        raise ConfigError(
            f"the VAE in the file's metadata is a {original['_class_name']!r}: diffusers' AutoencoderKLLTX2Video "
            "holds the convolutional VAE (CausalVideoAutoencoder) only"
        )
    # ltx-core's flat config: `spatial_padding_mode` is read by the decoder and, before its own key, the encoder
    shared_padding = original.get("spatial_padding_mode")
    return {
        **_shared(original),
        "patch_size": original.get("patch_size", 4),
        "timestep_conditioning": original.get("timestep_conditioning", True),
        "encoder_spatial_padding_mode": shared_padding or original.get("encoder_spatial_padding_mode", "zeros"),
        "decoder_spatial_padding_mode": shared_padding or "reflect",
        **_encoder(original, ltx2=True),
        **_decoder(original, ltx2=True),
    }


def config_from_metadata(metadata: dict, translate) -> dict | None:
    """The diffusers config (`translate`: ltx_video_config or ltx2_config) of a single file's safetensors metadata
    (`config`: JSON whose `vae` is the VAE's), None where it carries none."""
    if "config" not in metadata:
        return None
    if not isinstance(metadata["config"], str):
        raise ConfigError("the file's metadata config is not a JSON string")
    try:
        vae = json.loads(metadata["config"]).get("vae")
    except (ValueError, RecursionError, AttributeError):
        raise ConfigError("the file's metadata config is not a JSON object") from None
    if not isinstance(vae, dict):
        raise ConfigError("the file's metadata config has no VAE config (its 'vae')")
    try:
        return translate(vae)
    except ConfigError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a field of another type or missing
        raise ConfigError(f"the VAE config in the file's metadata is malformed ({type(e).__name__}: {e})") from None
