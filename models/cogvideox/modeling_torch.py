"""CogVideoX video VAE (diffusers' `AutoencoderKLCogVideoX`) in PyTorch, channels-first, written to run under torchax.

Parameter names and shapes are diffusers' own, so `AutoencoderKLCogVideoX.from_pretrained` reads what this model
saves, and `encode(x).latent_dist` / `decode(z).sample` behave the same. Differences from diffusers:
- No `CogVideoXSafeConv3d` chunking: it splits convs over time to save GPU memory, which XLA handles itself.
- GroupNorm statistics are taken in float32 whatever the input dtype.
- encoder/decoder steps take and return the conv cache explicitly (as diffusers' already do), so torchax can jit them;
  the cache holds frames channels-last (B, T, H, W, C).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.cache import run_cached
from ..common.inputs import expect_video
from ..common.layers_torch import GroupNorm, UpsampledConv2d
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import CogVideoXTiling, CogVideoXVAEConfig, frame_batches


class CogVideoXCausalConv3d(nn.Module):
    """Conv3d padded causally in time: the cached last k-1 input frames, or the first frame repeated on the first
    chunk; spatial padding is zeros. Returns (output, new cache)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1):
        super().__init__()
        kernel_size = (kernel_size,) * 3 if isinstance(kernel_size, int) else kernel_size
        self.time_kernel_size = kernel_size[0]
        pad = ((kernel_size[1] - 1) // 2, (kernel_size[2] - 1) // 2)
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride=(stride, 1, 1), padding=(0, *pad))

    def forward(self, x, cache=None):
        if self.time_kernel_size == 1:
            return self.conv(x), None
        # Padded and cached channels-last (B, T, H, W, C), the layout the convolution reads under torchax: its
        # transposes then cancel against XLA's, and the activations are read once, in order. The first chunk's
        # padding is one gather (the first frame's index repeated) so the input has a single reader.
        x = x.permute(0, 2, 3, 4, 1)
        if cache is None:
            x = x.index_select(1, torch.arange(1 - self.time_kernel_size, x.shape[1], device=x.device).clamp(min=0))
        else:
            x = torch.cat([cache, x], dim=1)
        return self.conv(x.permute(0, 4, 1, 2, 3)), x[:, -self.time_kernel_size + 1 :]


def _nearest_indices(in_size: int, out_size: int) -> torch.Tensor:
    """Source indices of PyTorch's 'nearest' resize (floor(dst * in/out) in float32)."""
    scale = torch.tensor(in_size / out_size, dtype=torch.float32)
    return torch.clamp(torch.floor(torch.arange(out_size, dtype=torch.float32) * scale).long(), max=in_size - 1)


def _resize_nearest(x, size):
    """F.interpolate(x, size, mode='nearest') over (T, H, W), as index gathers (which torchax lowers simply)."""
    for axis, out_size in zip((2, 3, 4), size):
        if x.shape[axis] != out_size:
            x = x.index_select(axis, _nearest_indices(x.shape[axis], out_size).to(x.device))
    return x


class CogVideoXSpatialNorm3D(nn.Module):
    """GroupNorm of f, modulated by convs of the latent zq resized to f (the first frame on its own if f has an odd
    number of frames > 1)."""

    def __init__(self, f_channels, zq_channels, groups=32):
        super().__init__()
        self.norm_layer = GroupNorm(num_channels=f_channels, num_groups=groups, eps=1e-6, affine=True)
        self.conv_y = CogVideoXCausalConv3d(zq_channels, f_channels, kernel_size=1)
        self.conv_b = CogVideoXCausalConv3d(zq_channels, f_channels, kernel_size=1)

    def forward(self, f, zq):
        # conv_y and conv_b act on each pixel alone, so they commute with the nearest resize: applied to zq before
        # it is resized, they cost its pixels rather than f's, and no compiled step holds their outputs at f's size
        size = f.shape[2:]
        return self.norm_layer(f) * _resize_like_f(self.conv_y(zq)[0], size) + _resize_like_f(self.conv_b(zq)[0], size)


def _resize_like_f(zq, size):
    """zq (B, C, T, H, W) resized to f's (T, H, W) as diffusers resizes it: the first frame on its own when f has an
    odd number of frames > 1. Frames first, at zq's own size, so that only the spatial gathers are done at f's."""
    t = size[0]
    if t > 1 and t % 2 == 1:
        zq = torch.cat([zq[:, :, :1], _resize_nearest(zq[:, :, 1:], (t - 1, *zq.shape[3:]))], dim=2)
    return _resize_nearest(zq, size)


class CogVideoXResnetBlock3D(nn.Module):
    def __init__(self, in_channels, out_channels, groups, eps, spatial_norm_dim=None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        if spatial_norm_dim is None:
            self.norm1 = GroupNorm(num_channels=in_channels, num_groups=groups, eps=eps)
            self.norm2 = GroupNorm(num_channels=out_channels, num_groups=groups, eps=eps)
        else:
            self.norm1 = CogVideoXSpatialNorm3D(in_channels, spatial_norm_dim, groups)
            self.norm2 = CogVideoXSpatialNorm3D(out_channels, spatial_norm_dim, groups)
        self.conv1 = CogVideoXCausalConv3d(in_channels, out_channels, kernel_size=3)
        self.conv2 = CogVideoXCausalConv3d(out_channels, out_channels, kernel_size=3)
        if in_channels != out_channels:
            self.conv_shortcut = nn.Conv3d(in_channels, out_channels, kernel_size=1)

    def _norm(self, norm, x, zq):
        return norm(x) if zq is None else norm(x, zq)

    def forward(self, x, zq=None, cache=None):
        cache = cache or {}
        new = {}
        h = F.silu(self._norm(self.norm1, x, zq))
        h, new["conv1"] = self.conv1(h, cache.get("conv1"))
        h = F.silu(self._norm(self.norm2, h, zq))
        h, new["conv2"] = self.conv2(h, cache.get("conv2"))
        if self.in_channels != self.out_channels:
            x = self.conv_shortcut(x)
        return h + x, new


def _compress_time_pool(x):
    """Average pairs of frames; with an odd count the first frame stays as it is. (B, C, T, H, W)."""
    t = x.shape[2]
    first, rest = (x[:, :, :1], x[:, :, 1:]) if t % 2 == 1 else (x[:, :, :0], x)
    b, c, r, h, w = rest.shape
    pooled = rest.reshape(b, c, r // 2, 2, h, w).mean(dim=3)
    return torch.cat([first, pooled], dim=2)


def _per_frame(conv2d: nn.Conv2d, x):
    """A Conv2d applied to each frame: (B, C, T, H, W) -> (B*T, C, H, W) -> conv -> (B, C', T, H', W')."""
    b, c, t, h, w = x.shape
    x = conv2d(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
    return x.reshape(b, t, *x.shape[1:]).permute(0, 2, 1, 3, 4)


class CogVideoXDownsample3D(nn.Module):
    def __init__(self, in_channels, out_channels, compress_time=False):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=0)
        self.compress_time = compress_time

    def forward(self, x):
        if self.compress_time and x.shape[2] > 1:
            x = _compress_time_pool(x)
        return _per_frame(self.conv, F.pad(x, (0, 1, 0, 1)))


class CogVideoXUpsample3D(nn.Module):
    def __init__(self, in_channels, out_channels, compress_time=False):
        super().__init__()
        self.conv = UpsampledConv2d(in_channels, out_channels)  # nearest x2 in H, W, then the convolution
        self.compress_time = compress_time

    def forward(self, x):
        t = x.shape[2]
        if self.compress_time and t > 1:  # nearest x2 in time; with an odd count the first frame is not doubled
            first, rest = (x[:, :, :1], x[:, :, 1:]) if t % 2 == 1 else (x[:, :, :0], x)
            x = torch.cat([first, rest.repeat_interleave(2, dim=2)], dim=2)
        return _per_frame(self.conv, x)


class CogVideoXDownBlock3D(nn.Module):
    def __init__(self, in_channels, out_channels, num_layers, groups, eps, add_downsample, compress_time):
        super().__init__()
        self.resnets = nn.ModuleList(
            [
                CogVideoXResnetBlock3D(in_channels if i == 0 else out_channels, out_channels, groups, eps)
                for i in range(num_layers)
            ]
        )
        self.downsamplers = nn.ModuleList(
            [CogVideoXDownsample3D(out_channels, out_channels, compress_time)] if add_downsample else []
        )

    def forward(self, x, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"))
        for downsampler in self.downsamplers:
            x = downsampler(x)
        return x, {"resnets": resnets}


class CogVideoXMidBlock3D(nn.Module):
    def __init__(self, channels, num_layers, groups, eps, spatial_norm_dim=None):
        super().__init__()
        self.resnets = nn.ModuleList(
            [CogVideoXResnetBlock3D(channels, channels, groups, eps, spatial_norm_dim) for _ in range(num_layers)]
        )

    def forward(self, x, zq=None, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"), zq)
        return x, {"resnets": resnets}


class CogVideoXUpBlock3D(nn.Module):
    def __init__(
        self, in_channels, out_channels, num_layers, groups, eps, spatial_norm_dim, add_upsample, compress_time
    ):
        super().__init__()
        self.resnets = nn.ModuleList(
            [
                CogVideoXResnetBlock3D(
                    in_channels if i == 0 else out_channels, out_channels, groups, eps, spatial_norm_dim
                )
                for i in range(num_layers)
            ]
        )
        self.upsamplers = nn.ModuleList(
            [CogVideoXUpsample3D(out_channels, out_channels, compress_time)] if add_upsample else []
        )

    def forward(self, x, zq, cache=None):
        x, resnets = run_cached(self.resnets, x, (cache or {}).get("resnets"), zq)
        for upsampler in self.upsamplers:
            x = upsampler(x)
        return x, {"resnets": resnets}


class CogVideoXEncoder3D(nn.Module):
    def __init__(self, config: CogVideoXVAEConfig):
        super().__init__()
        channels, groups, eps = config.block_out_channels, config.norm_num_groups, config.norm_eps
        self.conv_in = CogVideoXCausalConv3d(config.in_channels, channels[0], kernel_size=3)
        self.down_blocks = nn.ModuleList(
            [
                CogVideoXDownBlock3D(
                    level.in_channels,
                    level.out_channels,
                    config.layers_per_block,
                    groups,
                    eps,
                    add_downsample=level.resample,
                    compress_time=level.temporal,
                )  # fmt: skip
                for level in config.down_levels()
            ]
        )
        self.mid_block = CogVideoXMidBlock3D(channels[-1], 2, groups, eps)
        self.norm_out = GroupNorm(groups, channels[-1], eps=1e-6)
        self.conv_out = CogVideoXCausalConv3d(channels[-1], 2 * config.latent_channels, kernel_size=3)

    def forward(self, x, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(x, cache.get("conv_in"))
        x, new["down_blocks"] = run_cached(self.down_blocks, x, cache.get("down_blocks"))
        x, new["mid_block"] = self.mid_block(x, None, cache.get("mid_block"))
        x, new["conv_out"] = self.conv_out(F.silu(self.norm_out(x)), cache.get("conv_out"))
        return x, new


class CogVideoXDecoder3D(nn.Module):
    def __init__(self, config: CogVideoXVAEConfig):
        super().__init__()
        channels = list(reversed(config.block_out_channels))
        groups, eps, z = config.norm_num_groups, config.norm_eps, config.latent_channels
        self.conv_in = CogVideoXCausalConv3d(z, channels[0], kernel_size=3)
        self.mid_block = CogVideoXMidBlock3D(channels[0], 2, groups, eps, spatial_norm_dim=z)
        self.up_blocks = nn.ModuleList(
            [
                CogVideoXUpBlock3D(
                    level.in_channels,
                    level.out_channels,
                    config.layers_per_block + 1,
                    groups,
                    eps,
                    z,
                    add_upsample=level.resample,
                    compress_time=level.temporal,
                )  # fmt: skip
                for level in config.up_levels()
            ]
        )
        self.norm_out = CogVideoXSpatialNorm3D(channels[-1], z, groups=groups)
        self.conv_out = CogVideoXCausalConv3d(channels[-1], config.out_channels, kernel_size=3)

    def forward(self, z, cache=None):
        cache = cache or {}
        new = {}
        x, new["conv_in"] = self.conv_in(z, cache.get("conv_in"))
        x, new["mid_block"] = self.mid_block(x, z, cache.get("mid_block"))
        x, new["up_blocks"] = run_cached(self.up_blocks, x, cache.get("up_blocks"), z)
        x, new["conv_out"] = self.conv_out(F.silu(self.norm_out(x, z)), cache.get("conv_out"))
        return x, new


class AutoencoderKLCogVideoX(ChunkedAutoencoder):
    num_latent_frames_batch_size = 2
    num_sample_frames_batch_size = 8
    tiling_class = CogVideoXTiling

    def __init__(self, config: CogVideoXVAEConfig):
        super().__init__()
        self.config = config
        self.encoder = CogVideoXEncoder3D(config)
        self.decoder = CogVideoXDecoder3D(config)
        # diffusers sizes these from out_channels (not latent_channels); kept so its checkpoints load as they are.
        self.quant_conv = (
            nn.Conv3d(2 * config.out_channels, 2 * config.out_channels, 1) if config.use_quant_conv else None
        )
        self.post_quant_conv = (
            nn.Conv3d(config.out_channels, config.out_channels, 1) if config.use_post_quant_conv else None
        )

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, T, H, W) video, in batches of 8 frames (the remainder joins the first batch). `step` runs one
        chunk (see ChunkedAutoencoder.run_chunks)."""
        expect_video(x, self.config.in_channels, channels_last=False, what="encode", **self.config.encode_input_limits)
        bounds = frame_batches(x.shape[2], self.num_sample_frames_batch_size)
        return EncoderOutput(DiagonalGaussianDistribution(self.run_chunks("encoder", x, bounds, step)))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, T, H, W) latents, in batches of 2 latent frames (the remainder joins the first).
        Not clipped: diffusers does not clip CogVideoX's output."""
        expect_video(z, self.config.latent_channels, channels_last=False, what="decode")
        bounds = frame_batches(z.shape[2], self.num_latent_frames_batch_size)
        return DecoderOutput(self.run_chunks("decoder", z, bounds, step))
