"""LTX-2's vocoders (diffusers' `LTX2Vocoder` and `LTX2VocoderWithBWE`) in Flax NNX, channels-last: a mel
spectrogram (B, T, mel bins, C) to a waveform (B, samples, C), diffusers' arrays with the channel axis moved last.

Read it beside diffusers' `pipelines/ltx2/vocoder.py`: modules carry its names (nnx's `kernel` where PyTorch says
`weight`). A vocoder is a decoder only (models/common/protocol.py); a spectrogram runs whole, in one step. The
anti-aliasing filters, the mel filterbank and the STFT bases are buffers loaded from the checkpoint, in PyTorch's
layout; the resampler's filter is computed (filters.py). Kernels start at zero: the model exists to be filled."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ..common.conv import conv_general_dilated
from ..common.inputs import expect_spectrogram
from ..common.layers_flax import Buffer, Conv
from ..common.precision import plus_bias
from ..common.resample import anti_aliased_snake, snake_beta, upsample
from ..common.steps_flax import run_image
from ..common.tiling import TilingMixin
from .config import LTX2VocoderConfig, LTX2VocoderWithBWEConfig
from .filters import hann_resampler

DIMENSIONS = ("NWC", "WIO", "NWC")


def conv1d(in_channels, out_channels, kernel_size, *, dilation=1, bias=True, rngs, param_dtype):
    """PyTorch's Conv1d with padding "same" (odd kernels: as many zeros each side)."""
    total = dilation * (kernel_size - 1)
    return Conv(
        in_channels,
        out_channels,
        (kernel_size,),
        padding=((total // 2, total - total // 2),),
        kernel_dilation=dilation,
        use_bias=bias,
        kernel_init=nnx.initializers.zeros,
        rngs=rngs,
        param_dtype=param_dtype,
    )


class ConvTranspose1d(nnx.Module):
    """PyTorch's ConvTranspose1d(stride, padding): its (I, O, k) weight kept as (k, I, O), run as a convolution of
    the zero-stuffed input with the kernel reversed; output length (L - 1) x stride - 2 x padding + k; accumulated in
    float32 with its bias, rounded once (models/common/layers_flax.py, Conv)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, *, rngs, param_dtype):
        self.stride, self.edge = stride, kernel_size - 1 - padding
        self.kernel = nnx.Param(jnp.zeros((kernel_size, in_channels, out_channels), param_dtype))
        self.bias = nnx.Param(jnp.zeros((out_channels,), param_dtype))

    def __call__(self, x):
        y = conv_general_dilated(
            x, self.kernel[::-1].astype(x.dtype), (1,), [(self.edge, self.edge)], lhs_dilation=(self.stride,),
            dimension_numbers=DIMENSIONS, preferred_element_type=jnp.float32,
        )  # fmt: skip
        return plus_bias(y, self.bias[...], x.dtype)


class Filter(nnx.Module):
    """An anti-aliased activation's stored filter (1, 1, K): diffusers' UpSample1d's (a Kaiser filter) or
    DownSample1d's (the low-pass before decimation), kept as their `filter` buffer."""

    def __init__(self, kernel_size, *, param_dtype):
        self.filter = Buffer(jnp.zeros((1, 1, kernel_size), param_dtype))


class SnakeBeta(nnx.Module):
    """x + sin²(αx)/β per channel, α and β stored as logarithms (β = α where `use_beta` is off: plain Snake)."""

    def __init__(self, channels, use_beta=True, *, param_dtype):
        self.alpha = nnx.Param(jnp.zeros((channels,), param_dtype))
        self.beta = nnx.Param(jnp.zeros((channels,), param_dtype)) if use_beta else None

    def __call__(self, x):
        return snake_beta(x, self.alpha[...], None if self.beta is None else self.beta[...])


class LeakyReLU(nnx.Module):
    def __init__(self, negative_slope=0.01):
        self.negative_slope = negative_slope

    def __call__(self, x):
        return jax.nn.leaky_relu(x, self.negative_slope)


class AntiAliasAct1d(nnx.Module):
    """A SnakeBeta at `ratio` times the rate: upsampled, activated, low-passed back down (models/common/resample.py)."""

    def __init__(self, act: SnakeBeta, ratio, kernel_size, *, param_dtype):
        self.ratio = ratio
        self.upsample = Filter(kernel_size, param_dtype=param_dtype)
        self.act = act
        self.downsample = Filter(kernel_size, param_dtype=param_dtype)

    def __call__(self, x):
        beta = None if self.act.beta is None else self.act.beta[...]
        taps = self.upsample.filter[0, 0], self.downsample.filter[0, 0]
        return anti_aliased_snake(x, *taps, self.act.alpha[...], beta, self.ratio)


def activation(config: LTX2VocoderConfig, channels, *, param_dtype):
    if config.act_fn == "leaky_relu":
        return LeakyReLU(config.leaky_relu_negative_slope)
    act = SnakeBeta(channels, config.act_fn == "snakebeta", param_dtype=param_dtype)
    if config.antialias:
        return AntiAliasAct1d(act, config.antialias_ratio, config.antialias_kernel_size, param_dtype=param_dtype)
    return act


class ResBlock(nnx.Module):
    """Pairs of (activation, dilated convolution, activation, convolution), each pair's output added to its input."""

    def __init__(self, config, channels, kernel_size, dilations, *, rngs, param_dtype):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.convs1 = nnx.List([conv1d(channels, channels, kernel_size, dilation=d, **kw) for d in dilations])
        self.acts1 = nnx.List([activation(config, channels, param_dtype=param_dtype) for _ in dilations])
        self.convs2 = nnx.List([conv1d(channels, channels, kernel_size, **kw) for _ in dilations])
        self.acts2 = nnx.List([activation(config, channels, param_dtype=param_dtype) for _ in dilations])

    def __call__(self, x):
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class LTX2Vocoder(TilingMixin, nnx.Module):
    """Mel spectrogram to waveform: conv_in, then per upsampler a transposed convolution and the mean of its
    resblocks, then act_out, conv_out and the final activation."""

    tiling_class = None  # diffusers' class does not tile
    encoder = quant_conv = post_quant_conv = None  # a decoder only

    def __init__(self, config: LTX2VocoderConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        widths = [config.hidden_channels, *config.resnet_widths()]
        self.conv_in = conv1d(config.in_channels, config.hidden_channels, 7, **kw)
        self.upsamplers = nnx.List(
            [
                ConvTranspose1d(widths[i], widths[i + 1], k, s, (k - s) // 2, **kw)
                for i, (s, k) in enumerate(zip(config.upsample_factors, config.upsample_kernel_sizes))
            ]
        )
        self.resnets = nnx.List(
            [
                ResBlock(config, width, k, dilations, **kw)
                for width in widths[1:]
                for k, dilations in zip(config.resnet_kernel_sizes, config.resnet_dilations)
            ]
        )
        if config.act_fn == "leaky_relu":
            self.act_out = LeakyReLU()  # PyTorch's default slope (0.01), not the config's: as the original code
        else:
            self.act_out = AntiAliasAct1d(
                SnakeBeta(widths[-1], param_dtype=param_dtype), config.antialias_ratio, config.antialias_kernel_size,
                param_dtype=param_dtype,
            )  # fmt: skip
        self.conv_out = conv1d(widths[-1], config.out_channels, 7, bias=config.final_bias, **kw)

    def generate(self, x):
        """(B, T, in_channels) -> (B, T x hop, out_channels)."""
        config, per_level = self.config, len(self.config.resnet_kernel_sizes)
        x = self.conv_in(x)
        for i, upsampler in enumerate(self.upsamplers):
            if config.act_fn == "leaky_relu":
                x = jax.nn.leaky_relu(x, config.leaky_relu_negative_slope)
            x = upsampler(x)
            # jnp.mean sums low-precision outputs in float32 and rounds once, as diffusers' torch.mean does
            x = jnp.stack([resnet(x) for resnet in self.resnets[i * per_level : (i + 1) * per_level]]).mean(0)
        x = self.conv_out(self.act_out(x))
        if config.final_act_fn == "tanh":
            return jnp.tanh(x)
        return jnp.clip(x, -1, 1) if config.final_act_fn == "clamp" else x

    def decoder(self, mel, cache=None):
        """The part: (B, T, mel bins, C) -> (B, T x hop, out_channels), whole (no cache)."""
        b, t, bins, c = mel.shape
        return self.generate(jnp.swapaxes(mel, 2, 3).reshape(b, t, c * bins)), None

    def decode(self, mel, *, mesh=None):
        """(B, T, mel bins, C) spectrograms, C x mel bins = in_channels -> (B, T x hop, out_channels) waveforms."""
        expect_spectrogram(mel, self.config.in_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", mel, mesh)

    def __call__(self, mel, *, mesh=None):
        return self.decode(mel, mesh=mesh)


class CausalSTFT(nnx.Module):
    """The magnitudes of a causal STFT, a strided convolution over the stored bases (2F, 1, L); `inverse_basis` is
    carried as the checkpoint holds it."""

    def __init__(self, filter_length, hop_length, window_length, *, param_dtype):
        self.hop_length, self.left_pad = hop_length, max(0, window_length - hop_length)
        freqs = filter_length // 2 + 1
        self.forward_basis = Buffer(jnp.zeros((freqs * 2, 1, filter_length), param_dtype))
        self.inverse_basis = Buffer(jnp.zeros((freqs * 2, 1, filter_length), param_dtype))

    def __call__(self, waveform):
        """(N, L) -> (N, frames, F)."""
        x = jnp.pad(waveform, ((0, 0), (self.left_pad, 0)))[..., None]
        basis = jnp.transpose(self.forward_basis[...], (2, 1, 0)).astype(x.dtype)
        spec = jax.lax.conv_general_dilated(x, basis, (self.hop_length,), [(0, 0)], dimension_numbers=DIMENSIONS)
        real, imag = jnp.split(spec, 2, axis=-1)
        return jnp.sqrt(real**2 + imag**2)


class MelSTFT(nnx.Module):
    """log(max(mel_basis @ |STFT|, 1e-5)), the stored filterbank (mel bins, F)."""

    def __init__(self, config: LTX2VocoderWithBWEConfig, *, param_dtype):
        self.stft_fn = CausalSTFT(
            config.filter_length, config.hop_length, config.window_length, param_dtype=param_dtype
        )
        self.mel_basis = Buffer(jnp.zeros((config.num_mel_channels, config.filter_length // 2 + 1), param_dtype))

    def __call__(self, waveform):
        """(N, L) -> (N, frames, mel bins)."""
        magnitude = self.stft_fn(waveform)
        mel = jnp.einsum("ntf,mf->ntm", magnitude, self.mel_basis[...].astype(magnitude.dtype))
        return jnp.log(jnp.maximum(mel, 1e-5))


class LTX2VocoderWithBWE(TilingMixin, nnx.Module):
    """A vocoder at the input sampling rate, then a bandwidth extender: a second vocoder of that waveform's mel
    spectrogram, added to the waveform resampled to the output rate, clamped to [-1, 1]."""

    tiling_class = None
    encoder = quant_conv = post_quant_conv = None

    def __init__(self, config: LTX2VocoderWithBWEConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, param_dtype=param_dtype)
        self.config = config
        self.vocoder = LTX2Vocoder(config.vocoder, **kw)
        self.bwe_generator = LTX2Vocoder(config.bwe, **kw)
        self.mel_stft = MelSTFT(config, param_dtype=param_dtype)

    def decoder(self, mel, cache=None):
        """The part: (B, T, mel bins, C) -> (B, T x hop, out_channels), whole (no cache)."""
        x, _ = self.vocoder.decoder(mel)
        batch, samples, channels = x.shape
        x = jnp.pad(x, ((0, 0), (0, -samples % self.config.hop_length), (0, 0)))  # whole mel frames
        waveforms = jnp.swapaxes(x, 1, 2).reshape(batch * channels, -1)
        mel = self.mel_stft(waveforms).reshape(batch, channels, -1, self.config.num_mel_channels)
        mel = jnp.transpose(mel, (0, 2, 1, 3)).reshape(batch, mel.shape[2], -1)  # (B, frames, C x mel bins)
        # the resampler's filter is computed, as diffusers' non-persistent buffer
        taps, pad, *crop = hann_resampler(self.config.resample_ratio)
        skip = upsample(x, jnp.asarray(taps), self.config.resample_ratio, pad, crop)
        waveform = jnp.clip(self.bwe_generator.generate(mel) + skip, -1, 1)
        return waveform[:, : samples * self.config.resample_ratio], None

    def decode(self, mel, *, mesh=None):
        """(B, T, mel bins, C) spectrograms, C x mel bins = in_channels -> (B, T x hop, out_channels) waveforms at
        the output sampling rate."""
        expect_spectrogram(mel, self.config.in_channels, channels_last=True, what="decode")
        return run_image(self, "decoder", mel, mesh)

    __call__ = LTX2Vocoder.__call__
