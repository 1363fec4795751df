"""LTX-Video VAE (diffusers' `AutoencoderKLLTXVideo`) in PyTorch, channels-first, written to run under torchax.

Parameter and buffer names and shapes are diffusers' own, so `AutoencoderKLLTXVideo.from_pretrained` reads what this
model saves, and `encode(x).latent_dist` / `decode(z, temb).sample` behave the same, framewise and spatial tiling
included. Differences from diffusers: the noise 0.9.1's decoder adds is drawn before each decoder call and handed to
it (models/ltx/noise.py; by default from torch's global generator, in diffusers' order, so the draws are the same);
the encoder and the decoder take and return a (always empty) cache, as the chunk runner's step expects, so torchax
can jit them.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..common.inputs import expect_video
from ..common.layers_torch import pad_channels_last, pad_edges, rms_norm
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import STRIDES, ConvStyle, DownLevel, LTXVideoTiling, LTXVideoVAEConfig, UpLevel
from .noise import noise_maps

# diffusers' RMSNorm without weights over the channels, in float32
RMS_NORM_EPS = 1e-8


def space_to_depth(x, stride):
    """(B, C, T, H, W) -> (B, C*st*sh*sw, T/st, H/sh, W/sw), as diffusers' downsampler permutes it."""
    st, sh, sw = stride
    x = x.unflatten(4, (-1, sw)).unflatten(3, (-1, sh)).unflatten(2, (-1, st))
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(1, 4)


def depth_to_space(x, stride):
    b, c, t, h, w = x.shape
    st, sh, sw = stride
    x = x.reshape(b, -1, st, sh, sw, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


class LTXVideoCausalConv3d(nn.Module):
    """Conv3d padded in time by repeating edge frames and in space with zeros (the conv's own padding) or by
    reflection, as `style` says (config.ConvStyle)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, *, style: ConvStyle):
        super().__init__()
        self.kernel_size = kernel_size
        self.causal = style.causal
        pad = kernel_size // 2
        self.reflection = pad if style.padding == "reflect" else 0
        spatial = pad - self.reflection
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, stride, padding=(0, spatial, spatial))

    def forward(self, x):
        k, r = self.kernel_size, self.reflection
        front, back = (k - 1, 0) if self.causal else ((k - 1) // 2, (k - 1) // 2)
        x = pad_edges(x, ((front, back), (0, 0), (0, 0)))
        return self.conv(pad_channels_last(x, (r,) * 4, "reflect") if r else x)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, embedding_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, embedding_dim)
        self.linear_2 = nn.Linear(embedding_dim, embedding_dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class PixArtAlphaCombinedTimestepSizeEmbeddings(nn.Module):
    """diffusers' timestep embedder without size conditions: 256 sinusoids (cos first) -> Linear -> SiLU -> Linear."""

    def __init__(self, embedding_dim):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(256, embedding_dim)

    def forward(self, timestep, dtype):
        half = 128
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timestep.device) / half
        angles = timestep.float()[:, None] * torch.exp(exponent)[None]
        return self.timestep_embedder(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(dtype))


class LTXVideoResnetBlock3d(nn.Module):
    def __init__(self, in_channels, out_channels, eps, style, inject_noise=False, timestep_conditioning=False):
        super().__init__()
        self.conv1 = LTXVideoCausalConv3d(in_channels, out_channels, 3, style=style)
        self.conv2 = LTXVideoCausalConv3d(out_channels, out_channels, 3, style=style)
        self.norm3 = self.conv_shortcut = None
        if in_channels != out_channels:
            self.norm3 = nn.LayerNorm(in_channels, eps=eps)
            self.conv_shortcut = (
                nn.Conv3d(in_channels, out_channels, 1)
                if style.plain_shortcut
                else LTXVideoCausalConv3d(in_channels, out_channels, 1, style=style)
            )
        self.per_channel_scale1 = self.per_channel_scale2 = None
        if inject_noise:
            self.per_channel_scale1 = nn.Parameter(torch.zeros(in_channels, 1, 1))
            self.per_channel_scale2 = nn.Parameter(torch.zeros(in_channels, 1, 1))
        self.scale_shift_table = None
        if timestep_conditioning:
            self.scale_shift_table = nn.Parameter(torch.zeros(4, in_channels))

    @staticmethod
    def _add_noise(x, scale, noise):
        """diffusers adds one (H, W) map to every frame, scaled per channel."""
        if scale is None:
            return x
        return x + (next(noise).to(x.dtype)[None] * scale)[None, :, None]

    def forward(self, inputs, temb=None, noise=None):
        h = rms_norm(inputs, RMS_NORM_EPS)
        if self.scale_shift_table is not None:
            table = temb.unflatten(1, (4, -1)) + self.scale_shift_table[None, ..., None, None, None]
            shift_1, scale_1, shift_2, scale_2 = table.unbind(dim=1)
            h = h * (1 + scale_1) + shift_1
        h = self._add_noise(self.conv1(F.silu(h)), self.per_channel_scale1, noise)
        h = rms_norm(h, RMS_NORM_EPS)
        if self.scale_shift_table is not None:
            h = h * (1 + scale_2) + shift_2
        h = self._add_noise(self.conv2(F.silu(h)), self.per_channel_scale2, noise)
        if self.norm3 is not None:
            inputs = self.norm3(inputs.movedim(1, -1)).movedim(-1, 1)
        if self.conv_shortcut is not None:
            inputs = self.conv_shortcut(inputs)
        return h + inputs


class LTXVideoDownsampler3d(nn.Module):
    """A convolution to out/(st*sh*sw) channels, space-to-depth, plus the input space-to-depthed and averaged over
    channel groups; the first st-1 frames are repeated in front."""

    def __init__(self, in_channels, out_channels, stride, style):
        super().__init__()
        self.stride = stride
        product = math.prod(stride)
        self.group_size = in_channels * product // out_channels
        self.conv = LTXVideoCausalConv3d(in_channels, out_channels // product, 3, style=style)

    def forward(self, x):
        x = torch.cat([x[:, :, : self.stride[0] - 1], x], dim=2)
        residual = space_to_depth(x, self.stride).unflatten(1, (-1, self.group_size)).mean(dim=2)
        return space_to_depth(self.conv(x), self.stride) + residual


class LTXVideoUpsampler3d(nn.Module):
    """A convolution to in*(st*sh*sw)/upscale_factor channels, depth-to-space, the first st-1 frames dropped; with
    `residual`, plus the input depth-to-spaced and repeated (tiled) along channels."""

    def __init__(self, in_channels, stride, style, residual, upscale_factor):
        super().__init__()
        self.stride = stride
        self.residual = residual
        self.repeats = math.prod(stride) // upscale_factor
        self.conv = LTXVideoCausalConv3d(in_channels, in_channels * math.prod(stride) // upscale_factor, 3, style=style)

    def forward(self, x):
        drop = self.stride[0] - 1
        out = depth_to_space(self.conv(x), self.stride)[:, :, drop:]
        if self.residual:
            out = out + depth_to_space(x, self.stride).repeat(1, self.repeats, 1, 1, 1)[:, :, drop:]
        return out


def _resnets(channels, count, eps, style, inject_noise=False, timestep_conditioning=False):
    return nn.ModuleList(
        [
            LTXVideoResnetBlock3d(channels, channels, eps, style, inject_noise, timestep_conditioning)
            for _ in range(count)
        ]
    )


class LTXVideoDownBlock3D(nn.Module):
    """0.9.0's down block (also LTXVideo095DownBlock3D, which has no conv_out and other downsamplers)."""

    def __init__(self, level: DownLevel, eps, style):
        super().__init__()
        self.resnets = _resnets(level.in_channels, level.num_layers, eps, style)
        self.downsamplers = None
        if level.downsample == "conv":
            conv = LTXVideoCausalConv3d(level.in_channels, level.in_channels, 3, (2, 2, 2), style=style)
            self.downsamplers = nn.ModuleList([conv])
        elif level.downsample is not None:
            downsampler = LTXVideoDownsampler3d(level.in_channels, level.out_channels, STRIDES[level.downsample], style)
            self.downsamplers = nn.ModuleList([downsampler])
        self.conv_out = None
        if level.block_type == "LTXVideoDownBlock3D" and level.in_channels != level.out_channels:
            self.conv_out = LTXVideoResnetBlock3d(level.in_channels, level.out_channels, eps, style)

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return self.conv_out(x) if self.conv_out is not None else x


class LTXVideoMidBlock3d(nn.Module):
    def __init__(self, channels, num_layers, eps, style, inject_noise, timestep_conditioning):
        super().__init__()
        self.time_embedder = PixArtAlphaCombinedTimestepSizeEmbeddings(4 * channels) if timestep_conditioning else None
        self.resnets = _resnets(channels, num_layers, eps, style, inject_noise, timestep_conditioning)

    def forward(self, x, temb=None, noise=None):
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype).view(x.size(0), -1, 1, 1, 1)
        for resnet in self.resnets:
            x = resnet(x, temb, noise)
        return x


class LTXVideoUpBlock3d(nn.Module):
    def __init__(self, level: UpLevel, eps, style, timestep_conditioning):
        super().__init__()
        self.time_embedder = (
            PixArtAlphaCombinedTimestepSizeEmbeddings(4 * level.in_channels) if timestep_conditioning else None
        )
        self.conv_in = None
        if level.in_channels != level.out_channels:  # never timestep-conditioned nor noisy (config.ensure_supported)
            self.conv_in = LTXVideoResnetBlock3d(level.in_channels, level.out_channels, eps, style)
        self.upsamplers = None
        if level.upsample:
            upsampler = LTXVideoUpsampler3d(
                level.out_channels * level.upscale_factor,
                level.upsample,
                style,
                level.residual,
                level.upscale_factor,
            )
            self.upsamplers = nn.ModuleList([upsampler])
        self.resnets = _resnets(
            level.out_channels, level.num_layers, eps, style, level.inject_noise, timestep_conditioning
        )

    def forward(self, x, temb=None, noise=None):
        if self.conv_in is not None:
            x = self.conv_in(x)
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype).view(x.size(0), -1, 1, 1, 1)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        for resnet in self.resnets:
            x = resnet(x, temb, noise)
        return x


class LTXVideoEncoder3d(nn.Module):
    def __init__(self, config: LTXVideoVAEConfig):
        super().__init__()
        style, eps = config.conv_style("encoder"), config.resnet_norm_eps
        self.patch = (config.patch_size_t, config.patch_size)
        levels = config.down_levels()
        self.conv_in = LTXVideoCausalConv3d(
            config.in_channels * config.patch_size**2, config.encoder_in_width, 3, style=style
        )
        self.down_blocks = nn.ModuleList([LTXVideoDownBlock3D(level, eps, style) for level in levels])
        width = levels[-1].out_channels
        self.mid_block = LTXVideoMidBlock3d(width, config.layers_per_block[-1], eps, style, False, False)
        self.conv_out = LTXVideoCausalConv3d(width, config.latent_channels + 1, 3, style=style)

    def forward(self, x, cache=None):
        """A whole clip (no cache) -> moments: the means, then the one log-variance channel repeated."""
        pt, p = self.patch
        b, c, t, h, w = x.shape
        # diffusers' patch order puts the width's sub-index before the height's
        x = x.reshape(b, c, t // pt, pt, h // p, p, w // p, p).permute(0, 1, 3, 7, 5, 2, 4, 6).flatten(1, 4)
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.conv_out(F.silu(rms_norm(self.mid_block(x), RMS_NORM_EPS)))
        return torch.cat([x, x[:, -1:].repeat(1, x.size(1) - 2, 1, 1, 1)], dim=1), None


class LTXVideoDecoder3d(nn.Module):
    def __init__(self, config: LTXVideoVAEConfig):
        super().__init__()
        style, eps, conditioned = config.conv_style("decoder"), config.resnet_norm_eps, config.timestep_conditioning
        self.patch = (config.patch_size_t, config.patch_size)
        width = config.decoder_width
        self.conv_in = LTXVideoCausalConv3d(config.latent_channels, width, 3, style=style)
        self.mid_block = LTXVideoMidBlock3d(width, config.mid_layers, eps, style, config.mid_inject_noise, conditioned)
        levels = config.up_levels()
        self.up_blocks = nn.ModuleList([LTXVideoUpBlock3d(level, eps, style, conditioned) for level in levels])
        out_width = levels[-1].out_channels
        self.conv_out = LTXVideoCausalConv3d(
            out_width, config.out_channels * config.patch_size_t * config.patch_size**2, 3, style=style
        )
        self.time_embedder = self.scale_shift_table = self.timestep_scale_multiplier = None
        if conditioned:
            self.timestep_scale_multiplier = nn.Parameter(torch.tensor(1000.0))
            self.time_embedder = PixArtAlphaCombinedTimestepSizeEmbeddings(2 * out_width)
            self.scale_shift_table = nn.Parameter(torch.zeros(2, out_width))

    def forward(self, x, cache=None, temb=None, noise=()):
        """A whole clip (no cache); temb: (B,) timesteps where the decoder is timestep-conditioned; noise: the maps
        its noise-injecting resnets add, in order."""
        noise = iter(noise)
        x = self.conv_in(x)
        if self.timestep_scale_multiplier is not None:
            temb = temb * self.timestep_scale_multiplier
        x = self.mid_block(x, temb, noise)
        for block in self.up_blocks:
            x = block(x, temb, noise)
        x = rms_norm(x, RMS_NORM_EPS)
        if self.time_embedder is not None:
            table = self.time_embedder(temb, x.dtype).view(x.size(0), 2, -1, 1, 1, 1)
            table = table + self.scale_shift_table[None, ..., None, None, None]
            shift, scale = table.unbind(dim=1)
            x = x * (1 + scale) + shift
        x = self.conv_out(F.silu(x))
        pt, p = self.patch
        b, c, t, h, w = x.shape
        x = x.reshape(b, -1, pt, p, p, t, h, w).permute(0, 1, 5, 2, 6, 4, 7, 3)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3), None


class AutoencoderKLLTXVideo(ChunkedAutoencoder):
    tiling_class = LTXVideoTiling

    def __init__(self, config: LTXVideoVAEConfig):
        super().__init__()
        self.config = config
        self.encoder = LTXVideoEncoder3d(config)
        self.decoder = LTXVideoDecoder3d(config)
        self.quant_conv = self.post_quant_conv = None
        self.register_buffer("latents_mean", torch.zeros(config.latent_channels), persistent=True)
        self.register_buffer("latents_std", torch.ones(config.latent_channels), persistent=True)
        # diffusers' defaults: off (and its encode tests the decoding switch, as here)
        self.use_framewise_encoding = False
        self.use_framewise_decoding = False

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, T, H, W) video; `step` runs one clip or temporal tile (see ChunkedAutoencoder.run_chunks)."""
        expect_video(x, self.config.in_channels, channels_last=False, what="encode", **self.config.encode_input_limits)
        frames = (x.shape[2] - 1) // self.config.temporal_ratio + 1
        # diffusers' _encode tests the decoding switch for framewise tiles
        moments = self.run_clip("encoder", x, frames, self.use_framewise_decoding, step)
        return EncoderOutput(DiagonalGaussianDistribution(moments))

    def decode(self, z: torch.Tensor, temb=None, *, step=None, noise=None) -> DecoderOutput:
        """(B, latent_channels, T, H, W) latents; not clamped, as in diffusers.

        temb: the timestep of a timestep-conditioned decoder, one per batch entry (or one for all). noise, for a
        noise-injecting decoder: a torch.Generator, an integer seed (NumPy draws, the same on every target), or the
        maps of one untiled decode (models/ltx/noise.py); None draws from torch's global generator as diffusers
        does (the same maps after the same torch.manual_seed)."""
        expect_video(
            z, self.config.latent_channels, channels_last=False, what="decode", **self.config.decode_input_limits
        )
        frames = (z.shape[2] - 1) * self.config.temporal_ratio + 1
        fixed = {}
        if self.config.timestep_conditioning:
            if temb is None:
                raise ValueError("decode: this decoder is timestep-conditioned; pass temb (a timestep per batch entry)")
            temb = _as_tensor(temb, z).reshape(-1)
            fixed["temb"] = temb.expand(z.shape[0]) if temb.numel() == 1 else temb
        draws = None
        if self.config.injects_noise:

            def generated(shapes, call):
                return [torch.randn(shape, generator=noise).to(dtype=z.dtype, device=z.device) for shape in shapes]

            draws = noise_maps(self.config, noise, generated, lambda value: _as_tensor(value, z))

        def inputs(window):
            return fixed if draws is None else {**fixed, "noise": draws(window.shape[3], window.shape[4])}

        return DecoderOutput(
            self.run_clip("decoder", z, frames, self.use_framewise_decoding, step, inputs, drop_last=True)
        )


def _as_tensor(value, like: torch.Tensor) -> torch.Tensor:
    """A number, array or tensor as a tensor of `like`'s dtype and device (a torchax one under torchax)."""
    value = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value, np.float32))
    return value.to(dtype=like.dtype, device=like.device)


class AutoencoderKLLTX2Video(AutoencoderKLLTXVideo):
    """diffusers' `AutoencoderKLLTX2Video`: the same model, built from an LTX2VideoVAEConfig (what differs is in the
    config: encoder widths, upsampler strides, padding, shortcuts)."""
