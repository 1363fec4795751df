"""The tiny VAEs (diffusers' `AutoencoderTiny`: TAESD, TAESDXL, TAESD3, TAEF1) in Flax NNX, channels-last: images are
(B, H, W, C), latents (B, H/8, W/8, latent_channels) at the released depth.

Read it beside diffusers' `autoencoder_tiny.py` and `vae.py` (EncoderTiny, DecoderTiny, AutoencoderTinyBlock): each
coder is one list of layers, `layers.N` as in diffusers' Sequential (its activations and upsamplers hold indices and
no parameters). The encoder takes images in [-1, 1] to TAESD's [0, 1] and gives its latents (a deterministic encoder:
no distribution); the decoder soft-clamps latents to (-3, 3) and gives images in [-1, 1]. Kernels start at zero: the
model exists to be filled from a checkpoint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.conv import cpu_conv
from ..common.inputs import expect_image
from ..common.layers_flax import Conv, silu
from ..common.precision import in_float32
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from .config import AutoencoderTinyConfig, AutoencoderTinyTiling

ACTIVATIONS = {
    "relu": jax.nn.relu,
    "silu": silu,
    "swish": silu,
    "mish": in_float32(lambda x: x * jnp.tanh(jax.nn.softplus(x))),
    "gelu": in_float32(lambda x: jax.nn.gelu(x, approximate=False)),  # PyTorch's nn.GELU is the exact one
}


def conv(in_channels, out_channels, *, use_bias=True, strides=1, rngs, param_dtype):
    """diffusers' 3x3 nn.Conv2d with one zero around."""
    return Conv(
        in_channels,
        out_channels,
        (3, 3),
        strides=strides,
        padding=((1, 1), (1, 1)),
        use_bias=use_bias,
        kernel_init=nnx.initializers.zeros,
        rngs=rngs,
        param_dtype=param_dtype,
        conv_general_dilated=cpu_conv,
    )


class Activation(nnx.Module):
    """An activation layer of the list (no parameters)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, x):
        return ACTIVATIONS[self.name](x)


class Upsample(nnx.Module):
    """Nearest-neighbour upsampling (no parameters)."""

    def __init__(self, factor: int):
        self.factor = factor

    def __call__(self, x):
        return jnp.repeat(jnp.repeat(x, self.factor, axis=1), self.factor, axis=2)


class AutoencoderTinyBlock(nnx.Module):
    """Three 3x3 convolutions with the activation between them, added to the input, then a ReLU whatever the
    activation (diffusers' `fuse`). No block of this class changes its width (diffusers' would add a 1x1 `skip`)."""

    def __init__(self, channels, act_fn, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.conv = nnx.List(
            [conv(channels, channels, **kw), Activation(act_fn), conv(channels, channels, **kw), Activation(act_fn),
             conv(channels, channels, **kw)]
        )  # fmt: skip

    def __call__(self, x):
        h = x
        for layer in self.conv:
            h = layer(h)
        return jax.nn.relu(h + x)


class EncoderTiny(nnx.Module):
    def __init__(self, config: AutoencoderTinyConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        widths, act = config.encoder_block_out_channels, config.act_fn
        layers = []
        for i, (width, blocks) in enumerate(zip(widths, config.num_encoder_blocks)):
            first = i == 0
            layers.append(
                conv(config.in_channels if first else width, width, use_bias=first, strides=1 + (not first), **kw)
            )
            layers += [AutoencoderTinyBlock(width, act, **kw) for _ in range(blocks)]
        layers.append(conv(widths[-1], config.latent_channels, **kw))
        self.layers = nnx.List(layers)

    def __call__(self, x, cache=None):
        """A whole image in [-1, 1], taken to TAESD's [0, 1] (no cache: an image has no earlier frames)."""
        x = (x + 1) / 2
        for layer in self.layers:
            x = layer(x)
        return x, None


class DecoderTiny(nnx.Module):
    def __init__(self, config: AutoencoderTinyConfig, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        widths, act, last = config.decoder_block_out_channels, config.act_fn, len(config.decoder_block_out_channels) - 1
        layers = [conv(config.latent_channels, widths[0], **kw), Activation(act)]
        for i, (width, blocks) in enumerate(zip(widths, config.num_decoder_blocks)):
            layers += [AutoencoderTinyBlock(width, act, **kw) for _ in range(blocks)]
            if i < last:
                layers.append(Upsample(config.upsampling_scaling_factor))
            layers.append(conv(width, config.out_channels if i == last else width, use_bias=i == last, **kw))
        self.layers = nnx.List(layers)

    def __call__(self, x, cache=None):
        """A whole latent, soft-clamped to (-3, 3) (the original release's `Clamp`), to an image in [-1, 1]."""
        x = jnp.tanh(x / 3) * 3
        for layer in self.layers:
            x = layer(x)
        return x * 2 - 1, None


class AutoencoderTiny(TilingMixin, nnx.Module):
    tiling_class = AutoencoderTinyTiling

    def __init__(self, config: AutoencoderTinyConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.encoder = EncoderTiny(config, **kw)
        self.decoder = DecoderTiny(config, **kw)
        self.quant_conv = self.post_quant_conv = None

    def scale_latents(self, x):
        """Raw latents -> [0, 1], as TAESD stores them in 8 bits."""
        return jnp.clip(x / (2 * self.config.latent_magnitude) + self.config.latent_shift, 0, 1)

    def unscale_latents(self, x):
        """[0, 1] -> raw latents."""
        return (x - self.config.latent_shift) * (2 * self.config.latent_magnitude)

    def encode(self, x, *, mesh=None):
        """(B, H, W, C) images in [-1, 1] -> latents (B, ceil(H/r), ceil(W/r), latent_channels), deterministic."""
        expect_image(x, self.config.in_channels, channels_last=True, what="encode")
        return run_image(self, "encoder", x, mesh)

    def decode(self, z, *, mesh=None):
        """(B, h, w, latent_channels) latents -> (B, h*r, w*r, C) images in [-1, 1]."""
        expect_image(z, self.config.latent_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", z, mesh)
