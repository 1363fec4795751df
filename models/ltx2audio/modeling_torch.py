"""LTX-2's audio VAE (diffusers' `AutoencoderKLLTX2Audio`) in PyTorch, channels-first, written to run under torchax:
mel spectrograms (B, 2, T, mel bins) in, latents (B, 8, T/4, mel/4) out, and back.

Parameter names and shapes are diffusers' own (the LDM-style `down.{i}.block.{j}`, `mid.block_1`, `up.{i}`, each
causal convolution's `.conv`), so diffusers' `from_pretrained` reads what this model saves. Read it beside diffusers'
`autoencoder_kl_ltx2_audio.py`. The parts take and return an (always empty) cache, as the chunk runner's step expects;
a spectrogram runs whole, as in diffusers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.inputs import expect_image
from ..common.layers_torch import GroupNorm, rms_norm
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import AutoencoderKLLTX2AudioConfig, causal_padding, decoded_size, downsample_padding, upsample_crop


def _pad(x, padding):
    (top, bottom), (left, right) = padding
    return F.pad(x, (left, right, top, bottom))


class LTX2AudioCausalConv2d(nn.Module):
    """A 2-D convolution after zeros on the causal axis's start only (diffusers' `padding="causal"` by axis)."""

    def __init__(self, in_channels, out_channels, kernel_size, axis):
        super().__init__()
        self.padding = causal_padding(axis, kernel_size)
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        return self.conv(_pad(x, self.padding))


class LTX2AudioPixelNorm(nn.Module):
    """x over the root mean square of its channels at each position (no parameters), in float32."""

    def forward(self, x):
        return rms_norm(x, 1e-6)


def norm(config: AutoencoderKLLTX2AudioConfig, channels: int) -> nn.Module:
    return LTX2AudioPixelNorm() if config.norm_type == "pixel" else GroupNorm(32, channels, eps=1e-6)


class LTX2AudioResnetBlock(nn.Module):
    def __init__(self, config: AutoencoderKLLTX2AudioConfig, in_channels, out_channels):
        super().__init__()
        axis = config.causality_axis
        self.norm1 = norm(config, in_channels)
        self.conv1 = LTX2AudioCausalConv2d(in_channels, out_channels, 3, axis)
        self.norm2 = norm(config, out_channels)
        self.conv2 = LTX2AudioCausalConv2d(out_channels, out_channels, 3, axis)
        self.nin_shortcut = (
            LTX2AudioCausalConv2d(in_channels, out_channels, 1, axis) if in_channels != out_channels else None
        )

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.nin_shortcut(x) if self.nin_shortcut is not None else x)


class LTX2AudioAttnBlock(nn.Module):
    """One head over every (time, mel) position, 1x1 convolutions for its projections, the input added back."""

    def __init__(self, config: AutoencoderKLLTX2AudioConfig, channels):
        super().__init__()
        self.norm = norm(config, channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x):
        h = self.norm(x)
        b, c, t, f = x.shape
        q, k, v = (proj(h).flatten(2).transpose(1, 2) for proj in (self.q, self.k, self.v))  # (B, T*F, C)
        out = F.scaled_dot_product_attention(q.float().unsqueeze(1), k.float().unsqueeze(1), v.float().unsqueeze(1))
        out = out.squeeze(1).to(x.dtype).transpose(1, 2).reshape(b, c, t, f)
        return x + self.proj_out(out)


class LTX2AudioDownsample(nn.Module):
    def __init__(self, channels, axis):
        super().__init__()
        self.padding = downsample_padding(axis)
        self.conv = nn.Conv2d(channels, channels, 3, stride=2)

    def forward(self, x):
        return self.conv(_pad(x, self.padding))


class LTX2AudioUpsample(nn.Module):
    def __init__(self, channels, axis):
        super().__init__()
        self.crop = upsample_crop(axis)
        self.conv = LTX2AudioCausalConv2d(channels, channels, 3, axis)

    def forward(self, x):
        x = self.conv(x.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3))
        return x[:, :, self.crop[0] :, self.crop[1] :]


class Level(nn.Module):
    """A level's resnets, each followed by attention where the level has it, then its sampler (or none)."""

    def __init__(self, config, in_channels, out_channels, blocks, attention, sampler=None, sampler_name=None):
        super().__init__()
        widths = [in_channels] + [out_channels] * blocks
        self.block = nn.ModuleList([LTX2AudioResnetBlock(config, i, o) for i, o in zip(widths[:-1], widths[1:])])
        self.attn = nn.ModuleList(
            [LTX2AudioAttnBlock(config, out_channels) for _ in range(blocks)] if attention else []
        )
        if sampler is not None:
            setattr(self, sampler_name, sampler)

    def forward(self, x):
        for n, block in enumerate(self.block):
            x = block(x)
            if self.attn:
                x = self.attn[n](x)
        return x


class Mid(nn.Module):
    def __init__(self, config, channels):
        super().__init__()
        self.block_1 = LTX2AudioResnetBlock(config, channels, channels)
        self.attn_1 = LTX2AudioAttnBlock(config, channels) if config.mid_block_add_attention else None
        self.block_2 = LTX2AudioResnetBlock(config, channels, channels)

    def forward(self, x):
        x = self.block_1(x)
        return self.block_2(self.attn_1(x) if self.attn_1 is not None else x)


class LTX2AudioEncoder(nn.Module):
    def __init__(self, config: AutoencoderKLLTX2AudioConfig):
        super().__init__()
        axis, widths, last = config.causality_axis, config.widths, len(config.widths) - 1
        self.conv_in = LTX2AudioCausalConv2d(config.in_channels, config.base_channels, 3, axis)
        inputs = [config.base_channels, *widths[:-1]]
        self.down = nn.ModuleList(
            [
                Level(config, inputs[i], widths[i], config.num_res_blocks, config.attention_at(i),
                      LTX2AudioDownsample(widths[i], axis) if i < last else None, "downsample")
                for i in range(len(widths))
            ]
        )  # fmt: skip
        self.mid = Mid(config, widths[-1])
        self.norm_out = norm(config, widths[-1])
        self.conv_out = LTX2AudioCausalConv2d(widths[-1], 2 * config.latent_channels, 3, axis)

    def forward(self, x, cache=None):
        """A whole spectrogram (no cache)."""
        x = self.conv_in(x)
        for level in self.down:
            x = level(x)
            if hasattr(level, "downsample"):
                x = level.downsample(x)
        return self.conv_out(F.silu(self.norm_out(self.mid(x)))), None


class LTX2AudioDecoder(nn.Module):
    def __init__(self, config: AutoencoderKLLTX2AudioConfig):
        super().__init__()
        axis, widths = config.causality_axis, config.widths
        self.config = config
        self.conv_in = LTX2AudioCausalConv2d(config.latent_channels, widths[-1], 3, axis)
        self.mid = Mid(config, widths[-1])
        # up.{i} is the level of width widths[i], built from the deepest; its input is the level below's output
        inputs = [*widths[1:], widths[-1]]
        self.up = nn.ModuleList(
            [
                Level(config, inputs[i], widths[i], config.num_res_blocks + 1, config.attention_at(i),
                      LTX2AudioUpsample(widths[i], axis) if i > 0 else None, "upsample")
                for i in range(len(widths))
            ]
        )  # fmt: skip
        self.norm_out = norm(config, widths[0])
        self.conv_out = LTX2AudioCausalConv2d(widths[0], config.output_channels, 3, axis)

    def forward(self, z, cache=None):
        """A whole latent (no cache), cropped or zero-padded to 4T - 3 mel frames and the configured mel bins."""
        frames, bins = decoded_size(self.config, z.shape[2], z.shape[3])
        x = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            x = level(x)
            if hasattr(level, "upsample"):
                x = level.upsample(x)
        x = self.conv_out(F.silu(self.norm_out(x)))[:, :, :frames, :bins]
        return F.pad(x, (0, bins - x.shape[3], 0, frames - x.shape[2])), None


class AutoencoderKLLTX2Audio(ChunkedAutoencoder):
    tiling_class = None  # diffusers' class does not tile

    def __init__(self, config: AutoencoderKLLTX2AudioConfig):
        super().__init__()
        self.config = config
        self.encoder = LTX2AudioEncoder(config)
        self.decoder = LTX2AudioDecoder(config)
        self.quant_conv = self.post_quant_conv = None
        self.register_buffer("latents_mean", torch.zeros(config.base_channels))
        self.register_buffer("latents_std", torch.ones(config.base_channels))

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, in_channels, T, mel bins) spectrograms -> the latent distribution over (B, 8, ceil(T/4), mel/4)."""
        expect_image(x, self.config.in_channels, channels_last=False, what="encode", **self.config.encode_input_limits)
        return EncoderOutput(DiagonalGaussianDistribution(self.run_image("encoder", x, step)))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, T, bins) latents -> (B, output_channels, 4T - 3, mel_bins) spectrograms."""
        expect_image(z, self.config.latent_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", z, step))
