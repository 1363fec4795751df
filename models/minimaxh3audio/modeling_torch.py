"""MiniMax-H3's audio VAE (diffusers' `AutoencoderKLMiniMaxH3Audio`) in PyTorch, for torchax: diffusers' module
names, layouts and buffers, so a state_dict is diffusers' checkpoint. Read it beside diffusers'
`autoencoder_kl_minimax_h3_audio.py`. The weight-normed convolutions carry `weight_g` and `weight_v` and make their
weight from both at each call (no forward pre-hook, which a compiled step would not run); the causal attention is
the blocked one torchax lowers to the Flax models'; the anti-aliasing filters are buffers loaded from the
checkpoint. Both parts run whole, in one step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.inputs import expect_sequence
from ..common.layers_torch import channels_last_1d, frame_causal_attention
from ..common.outputs import DecoderOutput, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from ..ltx2vocoder.modeling_torch import AntiAliasAct1d, Filter, SnakeBeta
from .config import AutoencoderKLMiniMaxH3AudioConfig, adaptive_pool_matrix

ANTIALIAS_RATIO, ANTIALIAS_KERNEL = 2, 12  # diffusers' Activation1d defaults, which the released model uses


def norm_except_first(v: torch.Tensor) -> torch.Tensor:
    """v's norm over every dim but the first, (n, 1, 1)."""
    return v.square().sum(dim=tuple(range(1, v.ndim)), keepdim=True).sqrt()


def weight_norm(weight_g: torch.Tensor, weight_v: torch.Tensor) -> torch.Tensor:
    """PyTorch's weight_norm (dim 0): v scaled to norm g along dim 0 (in float32)."""
    v = weight_v.float()
    return (v * (weight_g.float() / norm_except_first(v))).to(weight_v.dtype)


def carry_weight_norm(conv: nn.Module):
    """`conv`'s weight replaced by `weight_v` and `weight_g` (its norm along dim 0, as weight_norm starts)."""
    conv.weight_v = nn.Parameter(conv.weight.detach())
    conv.weight_g = nn.Parameter(norm_except_first(conv.weight.detach()))
    del conv.weight


class WeightNormConv1d(nn.Conv1d):
    """weight_norm(Conv1d): `weight_g` (O, 1, 1) and `weight_v` (O, I, k) in place of `weight`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        carry_weight_norm(self)

    def forward(self, x):
        return self._conv_forward(x, weight_norm(self.weight_g, self.weight_v), self.bias)


class WeightNormConvTranspose1d(nn.ConvTranspose1d):
    """weight_norm(ConvTranspose1d): `weight_g` (I, 1, 1) and `weight_v` (I, O, k) in place of `weight`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        carry_weight_norm(self)

    def forward(self, x):
        weight = weight_norm(self.weight_g, self.weight_v)
        return F.conv_transpose1d(x, weight, self.bias, self.stride, self.padding)


class MiniMaxH3AudioSnake1d(nn.Module):
    """DAC's Snake: x + sin²(αx)/α per channel, α as stored (1, C, 1) (not a logarithm)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x):
        alpha = self.alpha.transpose(1, 2)  # computed channels-last, between 1D convolutions (channels_last_1d)
        return channels_last_1d(x, lambda last: last + (alpha + 1e-9).reciprocal() * torch.sin(alpha * last).pow(2))


class MiniMaxH3AudioDownSample1d(nn.Module):
    """The anti-aliased activation's low-pass filter, nested under `lowpass` as diffusers nests it."""

    def __init__(self, kernel_size: int):
        super().__init__()
        self.lowpass = Filter(kernel_size)

    @property
    def filter(self) -> torch.Tensor:
        return self.lowpass.filter


class MiniMaxH3AudioActivation1d(AntiAliasAct1d):
    """LTX-2's anti-aliased SnakeBeta at diffusers' Activation1d defaults, its downsampler's filter nested under
    `lowpass` as diffusers names it."""

    def __init__(self, channels: int):
        super().__init__(SnakeBeta(channels), ANTIALIAS_RATIO, ANTIALIAS_KERNEL)
        self.downsample = MiniMaxH3AudioDownSample1d(ANTIALIAS_KERNEL)


class MiniMaxH3AudioResidualUnit(nn.Module):
    """Snake, a dilated 7-tap convolution, Snake, a 1-tap convolution; added to the input (the lengths agree)."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            MiniMaxH3AudioSnake1d(dim),
            WeightNormConv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation),
            MiniMaxH3AudioSnake1d(dim),
            WeightNormConv1d(dim, dim, 1),
        )

    def forward(self, x):
        return x + self.block(x)


class MiniMaxH3AudioEncoderBlock(nn.Module):
    """Residual units at dilations 1, 3 and 9, Snake, then a strided convolution doubling the width."""

    def __init__(self, dim: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            *(MiniMaxH3AudioResidualUnit(dim // 2, d) for d in (1, 3, 9)),
            MiniMaxH3AudioSnake1d(dim // 2),
            WeightNormConv1d(dim // 2, dim, 2 * stride, stride=stride, padding=-(-stride // 2)),
        )

    def forward(self, x):
        return self.block(x)


class MiniMaxH3AudioEncoder(nn.Module):
    """DAC's waveform encoder: (B, 1, samples) -> (B, latent_dim, samples / hop)."""

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig):
        super().__init__()
        widths = config.encoder_widths()
        self.block = nn.Sequential(
            WeightNormConv1d(1, widths[0], 7, padding=3),
            *(MiniMaxH3AudioEncoderBlock(w, s) for w, s in zip(widths[1:], config.encoder_rates)),
            MiniMaxH3AudioSnake1d(widths[-1]),
            WeightNormConv1d(widths[-1], config.latent_dim, 3, padding=1),
        )

    def forward(self, x, cache=None):
        return self.block(x), None


class MiniMaxH3AudioCausalAttention(nn.Module):
    """Causal self-attention whose heads are averaged, not concatenated, and whose head width is then pooled down
    to `out_dim` (adaptive average pooling, as a matrix) before `proj`. The key bias is a stored zero buffer."""

    def __init__(self, in_dim: int, out_dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(in_dim, 3 * in_dim, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(in_dim))
        self.v_bias = nn.Parameter(torch.zeros(in_dim))
        self.register_buffer("zero_k_bias", torch.zeros(in_dim))
        self.proj = nn.Linear(out_dim, out_dim)
        pool = torch.from_numpy(adaptive_pool_matrix(in_dim // num_heads, out_dim))
        self.register_buffer("pool", pool, persistent=False)  # computed, as the Flax model's, not a checkpoint's

    def forward(self, x):
        b, t, width = x.shape
        qkv = F.linear(x, self.qkv.weight, torch.cat([self.q_bias, self.zero_k_bias, self.v_bias]))
        qkv = qkv.reshape(b, t, 3, self.num_heads, width // self.num_heads).permute(2, 0, 3, 1, 4)
        # heads into the batch: (B x heads, T, head width); the tokens are frames of one token each, seen causally
        q, k, v = (a.reshape(b * self.num_heads, t, -1) for a in qkv.unbind(0))
        out = frame_causal_attention(q, k, v, t).reshape(b, self.num_heads, t, -1).mean(dim=1)
        return self.proj(out @ self.pool.to(out.dtype))


class MiniMaxH3AudioGeGluMlp(nn.Module):
    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.norm = nn.LayerNorm(in_features)
        self.w0 = nn.Linear(in_features, hidden_features)
        self.w1 = nn.Linear(in_features, hidden_features)
        self.w2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        x = self.norm(x)
        return self.w2(F.gelu(self.w0(x), approximate="tanh") * self.w1(x))


class MiniMaxH3AudioAttnProjection(nn.Module):
    """`pre_block`: latent_dim -> latent_channels as proj(norm3(x)) + attn(norm1(x)), then a GeGLU feed-forward
    added."""

    def __init__(self, in_dim: int, out_dim: int, num_heads: int, mlp_ratio: int = 2):
        super().__init__()
        self.norm1 = nn.LayerNorm(in_dim)
        self.attn = MiniMaxH3AudioCausalAttention(in_dim, out_dim, num_heads)
        self.proj = nn.Linear(in_dim, out_dim)
        self.norm3 = nn.LayerNorm(in_dim)
        self.norm2 = nn.LayerNorm(out_dim)
        self.mlp = MiniMaxH3AudioGeGluMlp(out_dim, out_dim * mlp_ratio)

    def forward(self, x):
        x = self.proj(self.norm3(x)) + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MiniMaxH3AudioAMPBlock(nn.Module):
    """BigVGAN's AMP block: per dilation, (anti-aliased SnakeBeta, dilated convolution, anti-aliased SnakeBeta,
    convolution), added to its input; `activations` interleaves the two activations of each pair."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            WeightNormConv1d(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            WeightNormConv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations
        )
        self.activations = nn.ModuleList(MiniMaxH3AudioActivation1d(channels) for _ in range(2 * len(dilations)))

    def forward(self, x):
        acts = self.activations
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2]):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class MiniMaxH3AudioBigVGANDecoder(nn.Module):
    """BigVGAN: (B, latent_dim, T) -> (B, 1, T x hop) in [-1, 1]: conv_pre, per upsampler a transposed convolution
    (each in a list of one, as the checkpoint nests it) and the mean of its AMP blocks, then an anti-aliased
    SnakeBeta, conv_post and the clamp."""

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig):
        super().__init__()
        widths = config.decoder_widths()
        self.conv_pre = WeightNormConv1d(config.latent_dim, widths[0], 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ModuleList([WeightNormConvTranspose1d(widths[i], widths[i + 1], k, r, padding=(k - r) // 2)])
            for i, (r, k) in enumerate(zip(config.decoder_rates, config.decoder_kernel_sizes))
        )
        self.resblocks = nn.ModuleList(
            MiniMaxH3AudioAMPBlock(width, k, tuple(dilations))
            for width in widths[1:]
            for k, dilations in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.activation_post = MiniMaxH3AudioActivation1d(widths[-1])
        self.conv_post = WeightNormConv1d(widths[-1], 1, 7, padding=3, bias=False)
        self.per_level = len(config.resblock_kernel_sizes)

    def forward(self, x, cache=None):
        x = self.conv_pre(x)
        for i, (up,) in enumerate(self.ups):
            x = up(x)
            blocks = self.resblocks[i * self.per_level : (i + 1) * self.per_level]
            x = sum(block(x) for block in blocks) / self.per_level
        return torch.clamp(self.conv_post(self.activation_post(x)), -1.0, 1.0), None


class MiniMaxH3AudioDiagonalGaussianDistribution:
    """The posterior as diffusers' class holds it: the mean and the log standard deviation (not a log-variance)."""

    def __init__(self, mean: torch.Tensor, logs: torch.Tensor):
        self.mean, self.logs, self.std = mean, logs, torch.exp(logs)

    def mode(self):
        return self.mean

    def sample(self, generator=None):
        return self.mean + self.std * torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype)


class AutoencoderKLMiniMaxH3Audio(ChunkedAutoencoder):
    """A mono waveform to latents (the posterior's mean and log standard deviation) and back. The encoder part is
    DAC's encoder, its `pre_block` and the two heads standing where other families' quant_conv does; the decoder
    part is dec_in_proj (their post_quant_conv) then BigVGAN."""

    tiling_class = None  # diffusers' class does not tile

    def __init__(self, config: AutoencoderKLMiniMaxH3AudioConfig):
        super().__init__()
        self.config = config
        latent = config.latent_channels
        self.encoder = MiniMaxH3AudioEncoder(config)
        self.pre_block = MiniMaxH3AudioAttnProjection(config.latent_dim, latent, config.num_attention_heads)
        self.mean_proj = nn.Conv1d(latent, latent, 1)
        self.logs_proj = nn.Conv1d(latent, latent, 1)
        self.dec_in_proj = nn.Conv1d(latent, config.latent_dim, 1)
        self.decoder = MiniMaxH3AudioBigVGANDecoder(config)

    def posterior(self, x):
        """The encoder's trunk -> mean and log standard deviation, concatenated on the channels."""
        x = self.pre_block(x.transpose(1, 2)).transpose(1, 2)
        return torch.cat([self.mean_proj(x), self.logs_proj(x)], dim=1)

    @property
    def quant_conv(self):
        return self.posterior

    @property
    def post_quant_conv(self):
        return self.dec_in_proj

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, 1, samples) waveforms, zero-padded on the right to whole latent frames -> the posterior over
        (B, latent_channels, ceil(samples / hop))."""
        expect_sequence(x, 1, channels_last=False, what="encode")
        x = F.pad(x.to(self.mean_proj.weight.dtype), (0, -x.shape[-1] % self.config.hop))  # float32, as diffusers
        mean, logs = self.run_image("encoder", x, step).chunk(2, dim=1)
        return EncoderOutput(MiniMaxH3AudioDiagonalGaussianDistribution(mean, logs))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, T) latents -> (B, 1, T x hop) waveforms in [-1, 1]."""
        expect_sequence(z, self.config.latent_channels, channels_last=False, what="decode")
        return DecoderOutput(self.run_image("decoder", z.to(self.dec_in_proj.weight.dtype), step))

    def forward(self, sample: torch.Tensor, *, step=None) -> DecoderOutput:
        return self.decode(self.encode(sample, step=step).latent_dist.mode(), step=step)
