"""Qwen-Image 2.1's VAE in Flax NNX: Wan 2.2's model (models/wan/modeling_flax.py) with diffusers' image convolution
in place of the causal 3D one. Like diffusers' model it takes a one-frame video, (B, 1, H, W, C): the pipelines that
call it pass one, and the chunk runners, tiling and meshes of the video models then apply unchanged."""

from __future__ import annotations

from flax import nnx

from ..common.conv import cpu_conv
from ..common.layers_flax import Conv
from ..wan.modeling_flax import AutoencoderKLWan, triple


class QwenImage21CausalConv3d(Conv):
    """diffusers' `QwenImage21CausalConv3d`: a Conv2d over the frame, built from the arguments Wan gives its 3D
    convolution with their time axis dropped (a 1x1 `time_conv`, a 3x3 residual conv). Called as Wan's: where Wan's
    takes a history it returns (x, None), an image leaving no cache behind."""

    def __init__(self, in_channels, out_channels, kernel_size, *, padding=0, strides=1, rngs, param_dtype):
        pt, ph, pw = triple(padding)
        super().__init__(
            in_channels,
            out_channels,
            triple(kernel_size)[1:],
            strides=triple(strides)[1:],
            padding=((ph, ph), (pw, pw)),
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
            param_dtype=param_dtype,
            conv_general_dilated=cpu_conv,
        )
        self.history = 2 * pt

    def __call__(self, x, cache=None):
        y = super().__call__(x[:, 0])[:, None]  # (B, 1, H, W, C): the models take one frame
        return (y, None) if self.history else y


class AutoencoderKLQwenImage21(AutoencoderKLWan):
    causal_conv = QwenImage21CausalConv3d
