"""MiniMax-H3's video VAE (diffusers' `AutoencoderKLMiniMaxH3`) in PyTorch, channels-first, written to run under
torchax.

Parameter names and shapes are diffusers' own, so `AutoencoderKLMiniMaxH3.from_pretrained` reads what this model
saves, and `encode(x).latent_dist` / `decode(z).sample` behave the same, tiling on by default included. A causal
Conv3d encoder (reflect-padded in space, zero frames in front, GroupNorm per frame) runs each 17-frame clip alone; a
ViT decoder runs each chunk of latent frames alone, every latent voxel a token, with register tokens and a zero
token, a rotary embedding over (t, h, w) on a share of each head's channels, q/k RMS norms in float32, layer scales
and a SwiGLU feed-forward. Differences from diffusers: the encoder and the decoder take and return a (always empty)
cache, as the chunk runner's step expects, so torchax can jit them; the attention goes through
`F.scaled_dot_product_attention` with no mask, which the torchax runtime computes in blocks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..common.inputs import expect_video
from ..common.layers_torch import GroupNorm, pad_channels_last
from ..common.outputs import DecoderOutput, DiagonalGaussianDistribution, EncoderOutput
from ..common.steps_torch import ChunkedAutoencoder
from .clips import MiniMaxH3Tiling, decode_in_chunks, encode_in_clips, rope_angles
from .config import AutoencoderKLMiniMaxH3Config

PADDING_MODES = {"zeros": "constant"}  # diffusers' spatial_padding_mode as F.pad names it


class MiniMaxH3VideoCausalConv3d(nn.Conv3d):
    """Conv3d after padding: `spatial_padding` rows and columns around in the config's mode, `temporal_padding`
    zero frames in front."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, spatial_padding=0, temporal_padding=0,
                 spatial_padding_mode="reflect"):  # fmt: skip
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)
        self.spatial_padding, self.temporal_padding = spatial_padding, temporal_padding
        self.mode = PADDING_MODES.get(spatial_padding_mode, spatial_padding_mode)

    def forward(self, x):
        if self.spatial_padding or self.temporal_padding:
            x = pad_channels_last(x, (self.spatial_padding,) * 4, self.mode, self.temporal_padding)
        return super().forward(x)


class MiniMaxH3VideoGroupNorm(GroupNorm):
    """GroupNorm of each frame alone: time folded into the batch."""

    def forward(self, x):
        b, c, t, h, w = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        return super().forward(frames).reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4)


class MiniMaxH3VideoResnetBlock3d(nn.Module):
    def __init__(self, in_channels, out_channels, groups, eps, mode):
        super().__init__()
        self.norm1 = MiniMaxH3VideoGroupNorm(groups, in_channels, eps=eps)
        self.conv1 = MiniMaxH3VideoCausalConv3d(in_channels, out_channels, 3, 1, 1, 2, mode)
        self.norm2 = MiniMaxH3VideoGroupNorm(groups, out_channels, eps=eps)
        self.conv2 = MiniMaxH3VideoCausalConv3d(out_channels, out_channels, 3, 1, 1, 2, mode)
        self.conv_shortcut = None
        if in_channels != out_channels:
            self.conv_shortcut = MiniMaxH3VideoCausalConv3d(in_channels, out_channels, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.conv_shortcut is None else self.conv_shortcut(x)) + h


class MiniMaxH3VideoDownsample3d(nn.Module):
    """A strided 3x3x3 convolution; a spatial stride of 2 pads one row and column after, in the config's mode."""

    def __init__(self, channels, temporal_stride, spatial_stride, mode):
        super().__init__()
        self.spatial_stride = spatial_stride
        self.mode = PADDING_MODES.get(mode, mode)
        stride = (temporal_stride, spatial_stride, spatial_stride)
        self.conv = MiniMaxH3VideoCausalConv3d(channels, channels, 3, stride, 0, 2, mode)

    def forward(self, x):
        if self.spatial_stride == 2:
            x = pad_channels_last(x, (0, 1, 0, 1), self.mode)
        return self.conv(x)


class MiniMaxH3VideoDownBlock3d(nn.Module):
    def __init__(self, in_channels, out_channels, config: AutoencoderKLMiniMaxH3Config, level: int):
        super().__init__()
        groups, eps, mode = config.norm_num_groups, config.norm_eps, config.spatial_padding_mode
        self.resnets = nn.ModuleList(
            [
                MiniMaxH3VideoResnetBlock3d(in_channels if i == 0 else out_channels, out_channels, groups, eps, mode)
                for i in range(config.layers_per_block)
            ]
        )
        time, space = config.temporal_downsample_factors[level], config.spatial_downsample_factors[level]
        self.downsamplers = None
        if time * space > 1:
            self.downsamplers = nn.ModuleList([MiniMaxH3VideoDownsample3d(out_channels, time, space, mode)])

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        return x if self.downsamplers is None else self.downsamplers[0](x)


class MiniMaxH3VideoEncoder3d(nn.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config):
        super().__init__()
        channels, mode = config.block_out_channels, config.spatial_padding_mode
        self.conv_in = MiniMaxH3VideoCausalConv3d(config.in_channels, channels[0], 3, 1, 1, 2, mode)
        ins = (channels[0],) + tuple(channels[:-1])
        self.down_blocks = nn.ModuleList(
            [MiniMaxH3VideoDownBlock3d(ins[i], channels[i], config, i) for i in range(len(channels))]
        )
        self.norm_out = MiniMaxH3VideoGroupNorm(config.norm_num_groups, channels[-1], eps=config.norm_eps)
        self.conv_out = MiniMaxH3VideoCausalConv3d(channels[-1], 2 * config.latent_channels, 3, 1, 1, 2, mode)

    def forward(self, x, cache=None):
        """One clip (no cache: clips are encoded apart)."""
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.norm_out(x))), None


def rms_norm(x, eps, weight=None):
    """nn.RMSNorm's computation, in float32."""
    x = x.float()
    out = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight.float()


class RMSNorm(nn.Module):
    """nn.RMSNorm with its weight, computed in float32 (as diffusers' blocks call it, on float32 input)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return rms_norm(x, self.eps, self.weight)


def rotate(x, cos, sin):
    """The rotary embedding on the first cos.shape[-1] channels of each head (rotate-half), the rest passed."""
    d = cos.shape[-1]
    turned, passed = x[..., :d], x[..., d:]
    first, second = turned.chunk(2, dim=-1)
    return torch.cat([turned * cos + torch.cat([-second, first], dim=-1) * sin, passed], dim=-1)


class MiniMaxH3VideoAttention(nn.Module):
    def __init__(self, dim, heads, head_dim, eps):
        super().__init__()
        self.heads, self.eps = heads, eps
        self.to_q = nn.Linear(dim, heads * head_dim)
        self.to_k = nn.Linear(dim, heads * head_dim)
        self.to_v = nn.Linear(dim, heads * head_dim)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, dim)])

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        q, k, v = (proj(x).unflatten(2, (self.heads, -1)) for proj in (self.to_q, self.to_k, self.to_v))
        # q and k normalised in float32 whatever the compute dtype, as diffusers does
        q = rotate(rms_norm(q, self.eps).to(x.dtype), cos, sin)
        k = rotate(rms_norm(k, self.eps).to(x.dtype), cos, sin)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.to_out[0](out.transpose(1, 2).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, dim, inner):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner)

    def forward(self, x):
        up, gate = self.proj(x).chunk(2, dim=-1)  # diffusers' order: [up; gate]
        return up * F.silu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult):
        super().__init__()
        self.net = nn.ModuleList([SwiGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        return self.net[2](self.net[0](x))


class MiniMaxH3VideoTransformerBlock(nn.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config):
        super().__init__()
        dim, eps = config.dim, config.decoder_norm_eps
        self.norm1 = RMSNorm(dim, eps)
        self.attn = MiniMaxH3VideoAttention(dim, config.decoder_num_attention_heads,
                                            config.decoder_attention_head_dim, eps)  # fmt: skip
        self.scale1 = nn.Parameter(torch.zeros(dim))
        self.norm2 = RMSNorm(dim, eps)
        self.ff = FeedForward(dim, config.decoder_ffn_mult)
        self.scale2 = nn.Parameter(torch.zeros(dim))

    def forward(self, x, cos, sin):
        """x the float32 residual stream; the normed activations in the projections' dtype."""
        dtype = self.attn.to_q.weight.dtype
        x = x + self.attn(self.norm1(x).to(dtype), cos, sin).float() * self.scale1.float()
        return x + self.ff(self.norm2(x).to(dtype)).float() * self.scale2.float()


class MiniMaxH3VideoViTDecoder3d(nn.Module):
    def __init__(self, config: AutoencoderKLMiniMaxH3Config):
        super().__init__()
        self.config = config
        dim = config.dim
        self.proj_in = nn.Linear(config.latent_channels, dim)
        self.register_tokens = nn.Parameter(torch.zeros(1, config.decoder_num_register_tokens, dim))
        self.transformer_blocks = nn.ModuleList(
            [MiniMaxH3VideoTransformerBlock(config) for _ in range(config.decoder_num_layers)]
        )
        self.norm_out = nn.LayerNorm(dim, eps=config.decoder_norm_eps)
        patch = config.temporal_ratio * config.spatial_ratio**2
        self.proj_out = nn.Linear(dim, config.out_channels * patch)

    def forward(self, x, cache=None):
        """One chunk of latent frames (no cache: chunks are decoded apart)."""
        c = self.config
        b, _, t, h, w = x.shape
        tokens = self.proj_in(x.permute(0, 2, 3, 4, 1).reshape(b, t * h * w, -1)).float()
        registers = self.register_tokens.float().expand(b, -1, -1)
        tokens = torch.cat([tokens, registers, tokens.new_zeros(b, 1, tokens.shape[-1])], dim=1)
        angles = torch.from_numpy(rope_angles(c, t, h, w)).to(x.device)[None, :, None]  # (1, N, 1, rope_dim)
        dtype = self.proj_out.weight.dtype
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        for block in self.transformer_blocks:
            tokens = block(tokens, cos, sin)
        tokens = F.layer_norm(tokens, (tokens.shape[-1],), self.norm_out.weight.float(), self.norm_out.bias.float(),
                              self.norm_out.eps)  # fmt: skip
        out = self.proj_out(tokens[:, : t * h * w].to(dtype))
        pt, p = c.temporal_ratio, c.spatial_ratio
        out = out.view(b, t, h, w, c.out_channels, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return out.reshape(b, c.out_channels, t * pt, h * p, w * p), None


class AutoencoderKLMiniMaxH3(ChunkedAutoencoder):
    tiling_class = MiniMaxH3Tiling

    def __init__(self, config: AutoencoderKLMiniMaxH3Config):
        super().__init__()
        latent = config.latent_channels
        self.config = config
        self.encoder = MiniMaxH3VideoEncoder3d(config)
        self.quant_conv = nn.Conv3d(2 * latent, 2 * latent, 1)
        self.post_quant_conv = nn.Conv3d(latent, latent, 1)
        self.decoder = MiniMaxH3VideoViTDecoder3d(config)
        self.enable_tiling()  # as the model was released, and diffusers' class starts

    def encode(self, x: torch.Tensor, *, step=None) -> EncoderOutput:
        """(B, C, T, H, W) video, ImageNet-normalised; `step` runs one clip (see ChunkedAutoencoder.run_chunks)."""
        expect_video(x, self.config.in_channels, channels_last=False, what="encode", **self.config.encode_input_limits)
        x = x.to(self.quant_conv.weight.dtype)  # the encoder's, float32 in every output dtype (as diffusers)
        moments = encode_in_clips(
            lambda x, bounds: self.run_chunks("encoder", x, bounds, step), x, self.config, t_axis=2, concat=torch.cat
        )
        return EncoderOutput(DiagonalGaussianDistribution(moments))

    def decode(self, z: torch.Tensor, *, step=None) -> DecoderOutput:
        """(B, latent_channels, T, H, W) latents, T at least 3; not clamped, as in diffusers."""
        expect_video(z, self.config.latent_channels, channels_last=False, what="decode")
        z = z.to(self.post_quant_conv.weight.dtype)  # the output's dtype; its norms and scales compute in float32
        return DecoderOutput(
            decode_in_chunks(
                lambda chunk: self.run_chunks("decoder", chunk, [(0, chunk.shape[2])], step),
                z,
                self.config,
                t_axis=2,
                concat=torch.cat,
                as_array=lambda values, like: torch.as_tensor(values, dtype=like.dtype, device=like.device),
            )
        )
