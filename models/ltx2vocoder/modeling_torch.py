"""LTX-2's vocoders (diffusers' `LTX2Vocoder` and `LTX2VocoderWithBWE`) in PyTorch, for torchax: diffusers' module
names, layouts and buffers, so a state_dict is diffusers' checkpoint. Read it beside diffusers'
`pipelines/ltx2/vocoder.py`. A vocoder is a decoder only (models/common/protocol.py): `vocoder(mel)` as diffusers
calls it, or `decode(mel).sample`; a spectrogram runs whole in one step. The anti-aliasing filters, the mel
filterbank and the STFT bases are buffers loaded from the checkpoint; the resampler's filter is computed
(filters.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.inputs import expect_spectrogram
from ..common.layers_torch import anti_aliased_snake, channels_last_1d, snake_beta, upsample
from ..common.outputs import DecoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .config import LTX2VocoderConfig, LTX2VocoderWithBWEConfig
from .filters import hann_resampler


class Filter(nn.Module):
    """An anti-aliased activation's stored filter (1, 1, K): diffusers' UpSample1d's (a Kaiser filter) or
    DownSample1d's (the low-pass before decimation), kept as their `filter` buffer."""

    def __init__(self, kernel_size: int):
        super().__init__()
        self.register_buffer("filter", torch.zeros(1, 1, kernel_size))


class UpSample1d(nn.Module):
    """The bandwidth extender's resampler: zero-stuffing of x (B, L, C) by `ratio` through a computed Hann filter
    (filters.py; not a checkpoint buffer), edges replicated first and cropped after."""

    def __init__(self, ratio: int):
        super().__init__()
        self.ratio = ratio
        taps, self.pad, *self.crop = hann_resampler(ratio)
        self.register_buffer("filter", torch.from_numpy(taps).view(1, 1, -1), persistent=False)

    def forward(self, x):
        return upsample(x, self.filter[0, 0], self.ratio, self.pad, self.crop)


class SnakeBeta(nn.Module):
    """x + sin²(αx)/β per channel, α and β stored as logarithms (β = α where `use_beta` is off: plain Snake)."""

    def __init__(self, channels: int, use_beta: bool = True):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels)) if use_beta else None

    def forward(self, x):
        return snake_beta(x, self.alpha, self.beta, 1)


class AntiAliasAct1d(nn.Module):
    """A SnakeBeta at `ratio` times the rate: upsampled, activated, low-passed back down (anti_aliased_snake)."""

    def __init__(self, act: SnakeBeta, ratio: int, kernel_size: int):
        super().__init__()
        self.ratio = ratio
        self.upsample = Filter(kernel_size)
        self.act = act
        self.downsample = Filter(kernel_size)

    def forward(self, x):
        taps = self.upsample.filter[0, 0], self.downsample.filter[0, 0]
        return anti_aliased_snake(x, *taps, self.act.alpha, self.act.beta, self.ratio)


def activation(config: LTX2VocoderConfig, channels: int, use_beta: bool) -> nn.Module:
    """A resblock's activation: SnakeBeta (Snake where the config says snake and `use_beta` is off), or a leaky
    ReLU; anti-aliased where the config says so."""
    if config.act_fn == "leaky_relu":
        return nn.LeakyReLU(config.leaky_relu_negative_slope)
    act = SnakeBeta(channels, use_beta=use_beta or config.act_fn == "snakebeta")
    return AntiAliasAct1d(act, config.antialias_ratio, config.antialias_kernel_size) if config.antialias else act


class ResBlock(nn.Module):
    """Pairs of (activation, dilated convolution, activation, convolution), each pair's output added to its input."""

    def __init__(self, config: LTX2VocoderConfig, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()

        def conv(dilation):
            return nn.Conv1d(channels, channels, kernel_size, dilation=dilation, padding="same")

        self.convs1 = nn.ModuleList([conv(d) for d in dilations])
        self.acts1 = nn.ModuleList([activation(config, channels, use_beta=False) for _ in dilations])
        self.convs2 = nn.ModuleList([conv(1) for _ in dilations])
        self.acts2 = nn.ModuleList([activation(config, channels, use_beta=False) for _ in dilations])

    def forward(self, x):
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class LTX2Vocoder(ChunkedAutoencoder):
    """Mel spectrogram to waveform: conv_in, then per upsampler a transposed convolution and the mean of its
    resblocks, then act_out, conv_out and the final activation."""

    tiling_class = None  # diffusers' class does not tile
    encoder = quant_conv = post_quant_conv = None  # a decoder only

    def __init__(self, config: LTX2VocoderConfig):
        super().__init__()
        self.config = config
        widths = [config.hidden_channels, *config.resnet_widths()]
        self.conv_in = nn.Conv1d(config.in_channels, config.hidden_channels, 7, padding=3)
        self.upsamplers = nn.ModuleList(
            [
                nn.ConvTranspose1d(widths[i], widths[i + 1], k, stride=s, padding=(k - s) // 2)
                for i, (s, k) in enumerate(zip(config.upsample_factors, config.upsample_kernel_sizes))
            ]
        )
        self.resnets = nn.ModuleList(
            [
                ResBlock(config, width, k, dilations)
                for width in widths[1:]
                for k, dilations in zip(config.resnet_kernel_sizes, config.resnet_dilations)
            ]
        )
        if config.act_fn == "leaky_relu":
            self.act_out = nn.LeakyReLU()  # PyTorch's default slope (0.01), not the config's: as the original code
        else:
            self.act_out = AntiAliasAct1d(
                SnakeBeta(widths[-1]), config.antialias_ratio, config.antialias_kernel_size
            )  # anti-aliased always
        self.conv_out = nn.Conv1d(widths[-1], config.out_channels, 7, padding=3, bias=config.final_bias)

    def generate(self, x):
        """(B, in_channels, T) -> (B, out_channels, T x hop)."""
        config, per_level = self.config, len(self.config.resnet_kernel_sizes)
        x = self.conv_in(x)
        for i, upsampler in enumerate(self.upsamplers):
            if config.act_fn == "leaky_relu":
                x = F.leaky_relu(x, config.leaky_relu_negative_slope)
            x = upsampler(x)
            x = torch.stack([resnet(x) for resnet in self.resnets[i * per_level : (i + 1) * per_level]]).mean(0)
        x = self.conv_out(self.act_out(x))
        if config.final_act_fn == "tanh":
            return torch.tanh(x)
        return x.clamp(-1, 1) if config.final_act_fn == "clamp" else x

    def decoder(self, mel, cache=None):
        """The part: (B, C, T, mel bins) -> (B, out_channels, T x hop), whole (no cache)."""
        return self.generate(mel.transpose(2, 3).flatten(1, 2)), None

    def decode(self, mel: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, C, T, mel bins) spectrograms, C x mel bins = in_channels -> (B, out_channels, T x hop) waveforms."""
        expect_spectrogram(mel, self.config.in_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", mel, step))

    def forward(self, hidden_states: torch.Tensor, time_last: bool = False, *, step=None) -> torch.Tensor:
        """As diffusers calls it: `vocoder(mel)`, the mel (B, C, T, mel bins), or (B, C, mel bins, T) with
        `time_last`."""
        return self.decode(hidden_states.transpose(2, 3) if time_last else hidden_states, step=step).sample


class CausalSTFT(nn.Module):
    """The magnitudes of a causal STFT (Hann windows, left padding only), a strided convolution over the stored
    bases; `inverse_basis` is carried as the checkpoint holds it."""

    def __init__(self, filter_length: int, hop_length: int, window_length: int):
        super().__init__()
        self.hop_length, self.left_pad = hop_length, max(0, window_length - hop_length)
        freqs = filter_length // 2 + 1
        self.register_buffer("forward_basis", torch.zeros(freqs * 2, 1, filter_length))
        self.register_buffer("inverse_basis", torch.zeros(freqs * 2, 1, filter_length))

    def forward(self, waveform):
        spec = F.conv1d(F.pad(waveform[:, None], (self.left_pad, 0)), self.forward_basis, stride=self.hop_length)
        real, imag = spec.chunk(2, dim=1)
        return torch.sqrt(real**2 + imag**2)


class MelSTFT(nn.Module):
    """log(max(mel_basis @ |STFT|, 1e-5)), the stored filterbank."""

    def __init__(self, config: LTX2VocoderWithBWEConfig):
        super().__init__()
        self.stft_fn = CausalSTFT(config.filter_length, config.hop_length, config.window_length)
        self.register_buffer("mel_basis", torch.zeros(config.num_mel_channels, config.filter_length // 2 + 1))

    def forward(self, waveform):
        mel = torch.matmul(self.mel_basis.to(waveform.dtype), self.stft_fn(waveform))
        return torch.log(torch.clamp(mel, min=1e-5))


class LTX2VocoderWithBWE(ChunkedAutoencoder):
    """A vocoder at the input sampling rate, then a bandwidth extender: a second vocoder of that waveform's mel
    spectrogram, added to the waveform resampled to the output rate, clamped to [-1, 1]."""

    tiling_class = None
    encoder = quant_conv = post_quant_conv = None

    def __init__(self, config: LTX2VocoderWithBWEConfig):
        super().__init__()
        self.config = config
        self.vocoder = LTX2Vocoder(config.vocoder)
        self.bwe_generator = LTX2Vocoder(config.bwe)
        self.mel_stft = MelSTFT(config)
        self.resampler = UpSample1d(config.resample_ratio)

    def decoder(self, mel, cache=None):
        """The part: (B, C, T, mel bins) -> (B, out_channels, T x hop), whole (no cache)."""
        x, _ = self.vocoder.decoder(mel)
        batch, channels, samples = x.shape
        x = F.pad(x, (0, -samples % self.config.hop_length))  # whole mel frames
        mel = self.mel_stft(x.flatten(0, 1)).unflatten(0, (batch, channels))  # (B, C, mel bins, frames)
        skip = channels_last_1d(x, self.resampler)
        waveform = torch.clamp(self.bwe_generator.generate(mel.flatten(1, 2)) + skip, -1, 1)
        return waveform[..., : samples * self.config.resample_ratio], None

    def decode(self, mel: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, C, T, mel bins) spectrograms, C x mel bins = in_channels -> (B, out_channels, T x hop) waveforms at
        the output sampling rate."""
        expect_spectrogram(mel, self.config.in_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", mel, step))

    forward = LTX2Vocoder.forward
