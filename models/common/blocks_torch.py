"""The GroupNorm blocks that diffusers' 2-D VAEs (vae.py's Encoder and Decoder: `ResnetBlock2D`, `UNetMidBlock2D`,
`DownEncoderBlock2D`, `UpDecoderBlock2D`) and HunyuanVideo's 3-D VAE (`HunyuanVideoResnetBlockCausal3D`, ...) are
built of, in PyTorch, one set for every family of that design: the family gives its convolution,
`conv(in_channels, out_channels, kernel_size)`, and its samplers. Names as diffusers' state_dict has them."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from .layers_torch import Attention, GroupNorm

EPS = 1e-6  # every GroupNorm's, as diffusers builds these blocks


class ResnetBlock(nn.Module):
    """GroupNorm, SiLU, convolution, twice, added to the input (through a 1x1 `conv_shortcut` where the width
    changes)."""

    def __init__(self, in_channels, out_channels, groups, conv):
        super().__init__()
        self.norm1 = GroupNorm(groups, in_channels, eps=EPS)
        self.conv1 = conv(in_channels, out_channels, 3)
        self.norm2 = GroupNorm(groups, out_channels, eps=EPS)
        self.conv2 = conv(out_channels, out_channels, 3)
        self.conv_shortcut = conv(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (self.conv_shortcut(x) if self.conv_shortcut is not None else x)


class MidBlock(nn.Module):
    """Two resnets with the attention between them (optional, as the config says)."""

    def __init__(self, channels, groups, add_attention, conv):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock(channels, channels, groups, conv) for _ in range(2)])
        self.attentions = nn.ModuleList([Attention(channels, groups)]) if add_attention else [None]

    def forward(self, x):
        x = self.resnets[0](x)
        for attention, resnet in zip(self.attentions, self.resnets[1:]):
            if attention is not None:
                x = attention(x)
            x = resnet(x)
        return x


def resnets(in_channels, out_channels, num_layers, groups, conv) -> nn.ModuleList:
    """A level's resnets: the first changes the width, the others keep it."""
    return nn.ModuleList(
        [ResnetBlock(in_channels if i == 0 else out_channels, out_channels, groups, conv) for i in range(num_layers)]
    )


class DownBlock(nn.Module):
    """An encoder level (diffusers' `DownEncoderBlock2D`, `HunyuanVideoDownBlock3D`): its resnets, then its
    downsampler, or none."""

    def __init__(self, in_channels, out_channels, num_layers, groups, conv, downsampler):
        super().__init__()
        self.resnets = resnets(in_channels, out_channels, num_layers, groups, conv)
        self.downsamplers = nn.ModuleList([downsampler]) if downsampler is not None else None

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for downsampler in self.downsamplers or ():
            x = downsampler(x)
        return x


class UpBlock(nn.Module):
    """A decoder level (diffusers' `UpDecoderBlock2D`, `HunyuanVideoUpBlock3D`): its resnets, then its upsampler, or
    none."""

    def __init__(self, in_channels, out_channels, num_layers, groups, conv, upsampler):
        super().__init__()
        self.resnets = resnets(in_channels, out_channels, num_layers, groups, conv)
        self.upsamplers = nn.ModuleList([upsampler]) if upsampler is not None else None

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        for upsampler in self.upsamplers or ():
            x = upsampler(x)
        return x
