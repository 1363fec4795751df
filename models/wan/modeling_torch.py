"""Wan 2.1 and 2.2 video VAEs (diffusers' `AutoencoderKLWan`) in PyTorch, channels-first, written to run under torchax.

Parameter names and shapes are diffusers' own, so `AutoencoderKLWan.from_pretrained` reads what this model saves,
and `encode(x).latent_dist` / `decode(z).sample` behave the same. It runs in plain PyTorch (the converter's
reference) and on JAX through torchax. What differs from diffusers, for the sake of `jax.jit`:
- The causal feature cache is explicit: cached blocks take `cache` (None on the first chunk) and return
  `(x, new_cache)`, so `encoder(x, cache)` and `decoder(z, cache)` are pure steps torchax can compile.
- Every cache holds exactly CACHE_T frames (missing history is zeros, as diffusers' causal padding is), so cache
  shapes never change after the first step and each step compiles once; a conv's cache is channels-last.

Extension points: `AutoencoderKLWan.causal_conv` and `WanVAEConfig.frames`, as in modeling_flax.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.cache import run_cached
from ..common.inputs import expect_video
from ..common.layers_torch import UpsampledConv2d
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import WanTiling, WanVAEConfig, decode_chunks, encode_chunks

CACHE_T = 2


class WanCausalConv3d(nn.Conv3d):
    """Conv3d padded causally in time (2*p frames of history in front) and symmetrically in space."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.history = 2 * self.padding[0]
        self.padding = (0, self.padding[1], self.padding[2])

    def forward(self, x, cache=None):
        # x: (B, C, T, H, W); cache: (B, CACHE_T, H, W, C) of earlier frames, or None for none (zeros). Padded and
        # cached channels-last, the layout the convolution reads under torchax: its transposes then cancel against
        # XLA's, and the activations are read once, in order.
        if self.history == 0:
            return super().forward(x)
        if cache is None:
            last = x.permute(0, 2, 3, 4, 1)
            zeros = last.new_zeros((x.shape[0], CACHE_T, *last.shape[2:]))
            return self._after_zeros(x), torch.cat([zeros, last], dim=1)[:, -CACHE_T:]
        x = torch.cat([cache, x.permute(0, 2, 3, 4, 1)], dim=1)
        return super().forward(x[:, CACHE_T - self.history :].permute(0, 4, 1, 2, 3)), x[:, -CACHE_T:]

    def _after_zeros(self, x):
        """The convolution of x (B, C, T, H, W) after `history` zero frames, without their products: an output frame
        whose window starts among the zeros is taken with only the kernel's taps that reach x (a video's first
        chunk, an image, costs a third of the products)."""
        taps, zeros = self.kernel_size[0], self.history
        frames = x.shape[2] + zeros - taps + 1
        head = [
            F.conv3d(x[:, :, : j + taps - zeros], self.weight[:, :, zeros - j :], self.bias, padding=self.padding)
            for j in range(min(zeros, frames))
        ]
        return torch.cat([*head, super().forward(x)] if x.shape[2] >= taps else head, dim=2)


class WanRMS_norm(nn.Module):
    """F.normalize over channels * sqrt(C) * gamma; the norm is taken in float32 for low-precision inputs."""

    def __init__(self, dim, images=True):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones((dim, 1, 1) if images else (dim, 1, 1, 1)))

    def forward(self, x):
        # taken channels-last, the layout of the convolutions' activations under torchax (see WanCausalConv3d)
        last = x.movedim(1, -1)
        normalized = F.normalize(last.float(), dim=-1).to(x.dtype) * self.scale * self.gamma.reshape(-1)
        return normalized.movedim(-1, 1)


class AvgDown3D(nn.Module):
    """Parameter-free shortcut of a Wan 2.2 down block: folds factor_t frames and factor_s x factor_s pixels into
    channels and averages consecutive groups of them down to out_channels. A chunk whose frame count is not a
    multiple of factor_t gets zero frames in front."""

    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        super().__init__()
        self.out_channels, self.factor_t, self.factor_s = out_channels, factor_t, factor_s
        self.group_size = in_channels * factor_t * factor_s * factor_s // out_channels

    def forward(self, x):
        ft, fs = self.factor_t, self.factor_s
        x = F.pad(x, (0, 0, 0, 0, (-x.shape[2]) % ft, 0))
        b, c, t, h, w = x.shape
        x = x.reshape(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6)
        # (B, C, ft, fs, fs, T/ft, H/fs, W/fs) -> (B, out, group, ...) -> mean over each group
        return x.reshape(b, self.out_channels, self.group_size, t // ft, h // fs, w // fs).mean(dim=2)


class DupUp3D(nn.Module):
    """Parameter-free shortcut of a Wan 2.2 up block, the inverse regrouping of AvgDown3D: repeats channels, then
    unfolds them into factor_t frames and factor_s x factor_s pixels. The first chunk keeps only its last frame."""

    def __init__(self, in_channels, out_channels, factor_t, factor_s=1):
        super().__init__()
        self.out_channels, self.factor_t, self.factor_s = out_channels, factor_t, factor_s
        self.repeats = out_channels * factor_t * factor_s * factor_s // in_channels

    def forward(self, x, first_chunk=False):
        ft, fs = self.factor_t, self.factor_s
        b, _, t, h, w = x.shape
        # regrouped channels-last, the layout of the convolutions' activations under torchax (see WanRMS_norm)
        last = (
            x.movedim(1, -1).repeat_interleave(self.repeats, dim=-1).reshape(b, t, h, w, self.out_channels, ft, fs, fs)
        )
        # (B, T, H, W, out, ft, fs, fs) -> (B, T, ft, H, fs, W, fs, out)
        last = last.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, t * ft, h * fs, w * fs, self.out_channels)
        x = last.movedim(-1, 1)
        return x[:, :, ft - 1 :] if first_chunk else x


class WanResample(nn.Module):
    def __init__(self, dim, mode, upsample_out_dim=None, *, conv):
        super().__init__()
        self.mode = mode
        if mode in ("upsample2d", "upsample3d"):
            out_dim = upsample_out_dim or dim // 2
            # diffusers' nearest-exact upsampling by 2 (no parameters) in its place, done by the convolution after it
            self.resample = nn.Sequential(nn.Identity(), UpsampledConv2d(dim, out_dim))
        else:
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        if mode == "upsample3d":
            self.time_conv = conv(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = conv(dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))

    def forward(self, x, cache=None):
        b, c, t, h, w = x.shape
        new_cache = None
        if self.mode == "upsample3d":
            if cache is None:  # first chunk: no temporal upsampling, and the next chunk starts from zeros
                new_cache = x.new_zeros((b, CACHE_T, h, w, c))
            else:
                x, new_cache = self.time_conv(x, cache)  # (B, 2C, T, H, W): channel halves are frames 2t, 2t+1
                x = x.reshape(b, 2, c, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c, 2 * t, h, w)
        t = x.shape[2]
        x = self.resample(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        x = x.reshape(b, t, *x.shape[1:]).permute(0, 2, 1, 3, 4)
        if self.mode == "downsample3d":
            if cache is not None:  # the first chunk keeps its single frame
                return self.time_conv(torch.cat([cache, x], dim=2)), x[:, :, -1:]
            new_cache = x[:, :, -1:]
        return x, new_cache


class WanResidualBlock(nn.Module):
    def __init__(self, in_dim, out_dim, *, conv):
        super().__init__()
        self.norm1 = WanRMS_norm(in_dim, images=False)
        self.conv1 = conv(in_dim, out_dim, 3, padding=1)
        self.norm2 = WanRMS_norm(out_dim, images=False)
        self.conv2 = conv(out_dim, out_dim, 3, padding=1)
        self.conv_shortcut = conv(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        h = self.conv_shortcut(x)
        x, new["conv1"] = self.conv1(F.silu(self.norm1(x)), cache.get("conv1"))
        x, new["conv2"] = self.conv2(F.silu(self.norm2(x)), cache.get("conv2"))
        return x + h, new


class WanAttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame."""

    def __init__(self, dim):
        super().__init__()
        self.norm = WanRMS_norm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x, cache=None):
        b, c, t, h, w = x.shape
        frames = self.norm(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        qkv = self.to_qkv(frames).reshape(b * t, c * 3, h * w).permute(0, 2, 1)  # (B*T, H*W, 3C)
        q, k, v = qkv.chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(1, 2) / c**0.5, dim=-1)
        out = (weights @ v).permute(0, 2, 1).reshape(b * t, c, h, w)
        out = self.proj(out).reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)
        return x + out, None


class WanMidBlock(nn.Module):
    def __init__(self, dim, num_layers=1, *, conv):
        super().__init__()
        self.attentions = nn.ModuleList([WanAttentionBlock(dim) for _ in range(num_layers)])
        self.resnets = nn.ModuleList([WanResidualBlock(dim, dim, conv=conv) for _ in range(num_layers + 1)])

    def forward(self, x, cache=None):
        cache = (cache or {}).get("resnets", {})
        x, first = self.resnets[0](x, cache=cache.get("0"))
        new = {"0": first}
        for i, (attn, resnet) in enumerate(zip(self.attentions, self.resnets[1:]), start=1):
            x, _ = attn(x)
            x, new[str(i)] = resnet(x, cache=cache.get(str(i)))
        return x, {"resnets": new}


class WanResidualDownBlock(nn.Module):
    """Wan 2.2: residual blocks and an optional downsampler, plus the parameter-free AvgDown3D shortcut."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temperal_downsample=False, down_flag=False, *, conv):
        super().__init__()
        self.avg_shortcut = AvgDown3D(in_dim, out_dim, 2 if temperal_downsample else 1, 2 if down_flag else 1)
        self.resnets = nn.ModuleList(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, conv=conv) for i in range(num_res_blocks)]
        )
        mode = "downsample3d" if temperal_downsample else "downsample2d"
        self.downsampler = WanResample(out_dim, mode, conv=conv) if down_flag else None

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        shortcut = self.avg_shortcut(x)
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        if self.downsampler is not None:
            x, new["downsampler"] = self.downsampler(x, cache.get("downsampler"))
        return x + shortcut, new


class WanEncoder3d(nn.Module):
    def __init__(self, config: WanVAEConfig, *, conv):
        super().__init__()
        levels, blocks = config.down_levels(), config.num_res_blocks
        self.conv_in = conv(config.in_channels, levels[0].in_channels, 3, padding=1)
        self.down_blocks = nn.ModuleList()
        for level in levels:
            in_dim, out_dim = level.in_channels, level.out_channels
            if config.is_residual:
                self.down_blocks.append(
                    WanResidualDownBlock(in_dim, out_dim, blocks, level.temporal, level.resample, conv=conv)
                )
                continue
            for _ in range(blocks):
                self.down_blocks.append(WanResidualBlock(in_dim, out_dim, conv=conv))
                if level.attention:
                    self.down_blocks.append(WanAttentionBlock(out_dim))
                in_dim = out_dim
            if level.resample:
                mode = "downsample3d" if level.temporal else "downsample2d"
                self.down_blocks.append(WanResample(out_dim, mode, conv=conv))
        self.mid_block = WanMidBlock(out_dim, conv=conv)
        self.norm_out = WanRMS_norm(out_dim, images=False)
        self.conv_out = conv(out_dim, config.z_dim * 2, 3, padding=1)

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["down_blocks"] = run_cached(self.down_blocks, x, cache.get("down_blocks"))
        x, new["mid_block"] = self.mid_block(x, cache.get("mid_block"))
        x, new["conv_out"] = self.conv_out(F.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


class WanUpBlock(nn.Module):
    def __init__(self, in_dim, out_dim, num_res_blocks, upsample_mode, *, conv):
        super().__init__()
        self.resnets = nn.ModuleList(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, conv=conv) for i in range(num_res_blocks + 1)]
        )
        self.upsamplers = nn.ModuleList([WanResample(out_dim, upsample_mode, conv=conv)] if upsample_mode else [])

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        x, new["upsamplers"] = run_cached(self.upsamplers, x, cache.get("upsamplers"))
        return x, new


class WanResidualUpBlock(nn.Module):
    """Wan 2.2: residual blocks and an optional upsampler that keeps the width, plus the parameter-free DupUp3D
    shortcut (only where it upsamples)."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temperal_upsample=False, up_flag=False, *, conv):
        super().__init__()
        self.avg_shortcut = DupUp3D(in_dim, out_dim, 2 if temperal_upsample else 1, 2) if up_flag else None
        self.resnets = nn.ModuleList(
            [WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, conv=conv) for i in range(num_res_blocks + 1)]
        )
        mode = "upsample3d" if temperal_upsample else "upsample2d"
        self.upsampler = WanResample(out_dim, mode, upsample_out_dim=out_dim, conv=conv) if up_flag else None

    def forward(self, x, cache=None):
        first_chunk = cache is None
        cache = cache or {}
        new = {}
        shortcut = x
        x, new["resnets"] = run_cached(self.resnets, x, cache.get("resnets"))
        if self.upsampler is not None:
            x, new["upsampler"] = self.upsampler(x, cache.get("upsampler"))
            x = x + self.avg_shortcut(shortcut, first_chunk)
        return x, new


class WanDecoder3d(nn.Module):
    def __init__(self, config: WanVAEConfig, *, conv):
        super().__init__()
        levels, blocks = config.up_levels(), config.num_res_blocks
        self.conv_in = conv(config.z_dim, levels[0].in_channels, 3, padding=1)
        self.mid_block = WanMidBlock(levels[0].in_channels, conv=conv)
        self.up_blocks = nn.ModuleList()
        for level in levels:
            in_dim, out_dim = level.in_channels, level.out_channels
            if config.is_residual:
                self.up_blocks.append(
                    WanResidualUpBlock(in_dim, out_dim, blocks, level.temporal, level.resample, conv=conv)
                )
            else:
                mode = ("upsample3d" if level.temporal else "upsample2d") if level.resample else None
                self.up_blocks.append(WanUpBlock(in_dim, out_dim, blocks, mode, conv=conv))
        self.norm_out = WanRMS_norm(out_dim, images=False)
        self.conv_out = conv(out_dim, config.out_channels, 3, padding=1)

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["mid_block"] = self.mid_block(x, cache.get("mid_block"))
        x, new["up_blocks"] = run_cached(self.up_blocks, x, cache.get("up_blocks"))
        x, new["conv_out"] = self.conv_out(F.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


def patchify(x, patch):
    """(B, C, T, H, W) -> (B, C*p*p, T, H/p, W/p). Channel c*p*p + j*p + i holds pixel (i, j) of each patch: the
    pinned diffusers' order, width offset first."""
    if patch == 1:
        return x
    b, c, t, h, w = x.shape
    x = x.reshape(b, c, t, h // patch, patch, w // patch, patch)  # (B, C, T, H/p, i, W/p, j)
    return x.permute(0, 1, 6, 4, 2, 3, 5).reshape(b, c * patch * patch, t, h // patch, w // patch)


def unpatchify(x, patch):
    """The inverse of `patchify`: (B, C*p*p, T, H, W) -> (B, C, T, H*p, W*p)."""
    if patch == 1:
        return x
    b, c, t, h, w = x.shape
    c //= patch * patch
    x = x.reshape(b, c, patch, patch, t, h, w)  # (B, C, j, i, T, H, W)
    return x.permute(0, 1, 4, 5, 3, 6, 2).reshape(b, c, t, h * patch, w * patch)


class AutoencoderKLWan(ChunkedAutoencoder):
    tiling_class = WanTiling
    # every convolution but the resamplers' spatial ones, built from Wan's 3D arguments (a class that specialises
    # the architecture to images puts its own here: models/qwenimage21/)
    causal_conv = WanCausalConv3d

    def __init__(self, config: WanVAEConfig):
        super().__init__()
        self.config = config
        conv = self.causal_conv
        self.encoder = WanEncoder3d(config, conv=conv)
        self.quant_conv = conv(config.z_dim * 2, config.z_dim * 2, 1)
        self.post_quant_conv = conv(config.z_dim, config.z_dim, 1)
        self.decoder = WanDecoder3d(config, conv=conv)

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, T, H, W) video; the first frame alone, then chunks of 4 (frames past the last are dropped).
        Wan 2.2 folds 2x2 pixel patches into channels first. `step` runs one chunk (see
        ChunkedAutoencoder.run_chunks)."""
        config = self.config
        expect_video(
            x,
            config.video_channels,
            channels_last=False,
            what="encode",
            frames=config.frames,
            **config.encode_input_limits,
        )
        x = patchify(x, config.patch)
        moments = self.run_chunks("encoder", x, encode_chunks(x.shape[2]), step)
        return EncoderOutput(DiagonalGaussianDistribution(moments))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, z_dim, T, H, W) latents -> (B, C, 1 + 4*(T-1), sH, sW) video in [-1, 1] (s: scale_factor_spatial),
        one latent frame a step."""
        expect_video(z, self.config.z_dim, channels_last=False, what="decode", frames=self.config.frames)
        out = self.run_chunks("decoder", z, decode_chunks(z.shape[2]), step)
        return DecoderOutput(unpatchify(out, self.config.patch).clamp(-1.0, 1.0))
