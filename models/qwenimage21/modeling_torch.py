"""Qwen-Image 2.1's VAE in PyTorch for torchax: Wan 2.2's model (models/wan/modeling_torch.py) with diffusers' image
convolution in place of the causal 3D one, so its parameters are diffusers' 4-D kernels. Takes (B, C, 1, H, W), as
diffusers' model does."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from torch.nn.modules.utils import _triple

from ..wan.modeling_torch import AutoencoderKLWan


class QwenImage21CausalConv3d(nn.Conv2d):
    """diffusers' `QwenImage21CausalConv3d`: a Conv2d over the frame, built from the arguments Wan gives its 3D
    convolution with their time axis dropped. Called as Wan's: where Wan's takes a history it returns (x, None), an
    image leaving no cache behind."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        (_, *kernel), (_, *strides), (pt, *spatial) = _triple(kernel_size), _triple(stride), _triple(padding)
        super().__init__(in_channels, out_channels, kernel, stride=strides, padding=spatial)
        self.history = 2 * pt

    def forward(self, x, cache=None):
        # the frame kept as a time axis of one and the kernel given one tap: a convolution of the 5-D activations,
        # which the torchax runtime computes channels-last, where squeezing the frame axis off would make XLA:CPU
        # copy every output into the channels-first order of the 4-D view (the output is Conv2d's)
        y = F.conv3d(x, self.weight.unsqueeze(2), self.bias, (1, *self.stride), (0, *self.padding))
        return (y, None) if self.history else y


class AutoencoderKLQwenImage21(AutoencoderKLWan):
    causal_conv = QwenImage21CausalConv3d
