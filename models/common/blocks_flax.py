"""The GroupNorm blocks that diffusers' 2-D VAEs (vae.py's Encoder and Decoder: `ResnetBlock2D`, `UNetMidBlock2D`,
`DownEncoderBlock2D`, `UpDecoderBlock2D`) and HunyuanVideo's 3-D VAE (`HunyuanVideoResnetBlockCausal3D`, ...) are
built of, in Flax NNX, one set for every family of that design: the family gives its convolution,
`conv(in_channels, out_channels, kernel_size, rngs=..., param_dtype=...)`, and its samplers. Parameter paths are
diffusers' (`resnets.N.conv1`, `attentions.0`, `downsamplers.0`, `upsamplers.0`)."""

from __future__ import annotations

from flax import nnx

from .layers_flax import Attention, GroupNorm, silu

EPS = 1e-6  # every GroupNorm's, as diffusers builds these blocks


class ResnetBlock(nnx.Module):
    """GroupNorm, SiLU, convolution, twice, added to the input (through a 1x1 `conv_shortcut` where the width
    changes)."""

    def __init__(self, in_channels, out_channels, groups, conv, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.norm1 = GroupNorm(groups, in_channels, EPS, param_dtype=param_dtype)
        self.conv1 = conv(in_channels, out_channels, 3, **kw)
        self.norm2 = GroupNorm(groups, out_channels, EPS, param_dtype=param_dtype)
        self.conv2 = conv(out_channels, out_channels, 3, **kw)
        self.conv_shortcut = conv(in_channels, out_channels, 1, **kw) if in_channels != out_channels else None

    def __call__(self, x):
        h = self.conv1(silu(self.norm1(x)))
        h = self.conv2(silu(self.norm2(h)))
        return h + (self.conv_shortcut(x) if self.conv_shortcut is not None else x)


class MidBlock(nnx.Module):
    """Two resnets with the attention between them (optional, as the config says)."""

    def __init__(self, channels, groups, add_attention, conv, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.resnets = nnx.List([ResnetBlock(channels, channels, groups, conv, **kw) for _ in range(2)])
        self.attentions = nnx.List([Attention(channels, groups, **kw) if add_attention else None])

    def __call__(self, x):
        x = self.resnets[0](x)
        for attention, resnet in zip(self.attentions, self.resnets[1:]):
            if attention is not None:
                x = attention(x)
            x = resnet(x)
        return x


def resnets(in_channels, out_channels, num_layers, groups, conv, **kw) -> nnx.List:
    """A level's resnets: the first changes the width, the others keep it."""
    return nnx.List(
        [
            ResnetBlock(in_channels if i == 0 else out_channels, out_channels, groups, conv, **kw)
            for i in range(num_layers)
        ]
    )


class DownBlock(nnx.Module):
    """An encoder level (diffusers' `DownEncoderBlock2D`, `HunyuanVideoDownBlock3D`): its resnets, then its
    downsampler, or none."""

    def __init__(self, in_channels, out_channels, num_layers, groups, conv, downsampler, *, rngs, param_dtype):
        self.resnets = resnets(in_channels, out_channels, num_layers, groups, conv, rngs=rngs, param_dtype=param_dtype)
        self.downsamplers = nnx.List([downsampler]) if downsampler is not None else None

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return x


class UpBlock(nnx.Module):
    """A decoder level (diffusers' `UpDecoderBlock2D`, `HunyuanVideoUpBlock3D`): its resnets, then its upsampler, or
    none."""

    def __init__(self, in_channels, out_channels, num_layers, groups, conv, upsampler, *, rngs, param_dtype):
        self.resnets = resnets(in_channels, out_channels, num_layers, groups, conv, rngs=rngs, param_dtype=param_dtype)
        self.upsamplers = nnx.List([upsampler]) if upsampler is not None else None

    def __call__(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        return x
