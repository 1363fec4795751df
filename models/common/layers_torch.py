"""PyTorch layers several families share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .anti_alias import edges


def pad_edges(x, pads):
    """x (B, C, T, H, W) padded by repeating its edge frames, rows and columns: `pads` is (before, after) for T, H
    and W. Padded channels-last, the layout the convolutions read under torchax (converter/torchax_runtime.py): XLA
    then materialises the padded input as they read it, not transposed."""
    last = x.permute(0, 2, 3, 4, 1)
    for axis, (before, after) in enumerate(pads, start=1):
        if before or after:
            last = torch.cat([edge_copies(last, axis, 0, before), last, edge_copies(last, axis, -1, after)], dim=axis)
    return last.permute(0, 4, 1, 2, 3)


def pad_channels_last(x, spatial=(0, 0, 0, 0), mode="constant", frames_before=0):
    """F.pad of x (B, C, T, H, W) by `spatial` (left, right, top, bottom, as F.pad lists them) in `mode`, then by
    `frames_before` zero frames in front, computed channels-last as pad_edges is: padded channels-first, XLA wrote
    each padded input out and the convolution read it transposed."""
    last = x.permute(0, 2, 3, 4, 1)
    if any(spatial):
        last = F.pad(last, (0, 0, *spatial), mode=mode)
    if frames_before:
        last = F.pad(last, (0, 0, 0, 0, 0, 0, frames_before, 0))
    return last.permute(0, 4, 1, 2, 3)


def edge_copies(x, axis, index, copies):
    """`copies` of x's slice `index` (0 or -1) along `axis`, broadcast as jnp.pad's edge mode does: sliced once per
    copy instead, XLA fuses the activation before the padding (a SiLU) into the concatenation and recomputes it."""
    edge = x.narrow(axis, index % x.shape[axis], 1)
    return edge.expand(*x.shape[:axis], copies, *x.shape[axis + 1 :])


def rms_norm(x, eps):
    """x over the root mean square of its channels (dim 1) at each position, no parameters, in float32. Computed
    channels-last, the layout the convolutions around it read and write under torchax (converter/torchax_runtime.py):
    over dim 1, XLA wrote every square out channels-first before summing it."""
    x32 = x.float().movedim(1, -1)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).movedim(-1, 1).to(x.dtype)


def channels_last_1d(x, call):
    """`call` (B, L, C) -> (B, L', C) on x (B, C, L), as (B, C, L'): a chain of elementwise work and filters along L
    (an anti-aliased activation) computed channels-last, the layout the 1D convolutions around it read and write
    under torchax (converter/torchax_runtime.py). There XLA cancels the transposes against the convolutions' own and
    materialises each filtered signal as the next reads it; computed channels-first, each was read transposed."""
    return call(x.transpose(1, 2)).transpose(1, 2)


def fir(x, taps, stride: int = 1):
    """Every channel of x (B, L, C) through one filter `taps` (K,): a depthwise Conv1d (a correlation, no padding)
    with `stride`, as diffusers'."""
    channels = x.shape[-1]
    weight = taps.view(1, 1, -1).expand(channels, 1, -1)
    return F.conv1d(x.transpose(1, 2), weight, stride=stride, groups=channels).transpose(1, 2)


def replicate(x, left: int, right: int):
    """x (B, L, C) with its first sample repeated `left` times before it and its last `right` times after."""
    return torch.cat([edge_copies(x, 1, 0, left), x, edge_copies(x, 1, -1, right)], dim=1)


def upsample(x, taps, ratio: int, pad: int, crop: tuple[int, int]):
    """Zero-stuffing of x (B, L, C) by `ratio` through the low-pass filter `taps` (a depthwise ConvTranspose1d, as
    diffusers'), edges replicated by `pad` first and `crop` (start, end) samples dropped after."""
    channels = x.shape[-1]
    weight = taps.to(x.dtype).view(1, 1, -1).expand(channels, 1, -1)
    y = F.conv_transpose1d(replicate(x, pad, pad).transpose(1, 2), weight, stride=ratio, groups=channels)
    return (ratio * y).transpose(1, 2)[:, crop[0] : y.shape[-1] - crop[1]]


def snake_beta(x, log_alpha, log_beta, channel_dim: int):
    """x + sin²(αx)/β per channel (`channel_dim`), α and β given as logarithms (no β: β = α, plain Snake)."""
    shape = [1] * x.ndim
    shape[channel_dim] = -1
    alpha = torch.exp(log_alpha).view(shape)
    amplitude = alpha if log_beta is None else torch.exp(log_beta).view(shape)
    return x + (1.0 / (amplitude + 1e-9)) * torch.sin(x * alpha).pow(2)


@torch.library.custom_op("vae_convert::anti_aliased_snake", mutates_args=())
def anti_aliased_snake(
    x: torch.Tensor,
    up_taps: torch.Tensor,
    down_taps: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor | None,
    ratio: int,
) -> torch.Tensor:
    """snake_beta at `ratio` times the rate of x (B, C, L): upsampled through `up_taps` (K,), activated, low-passed
    through `down_taps` (K,) and decimated back to L samples, each filter's edges replicated (diffusers'
    Activation1d, computed channels-last as channels_last_1d says). The torchax runtime lowers it to the Flax models'
    jitted function (models/common/resample.py), traced once a shape rather than op by op at every call."""
    pad, crop, down_pad = edges(up_taps.shape[0], down_taps.shape[0], ratio)

    def channels_last(x):
        y = snake_beta(upsample(x, up_taps, ratio, pad, crop), log_alpha, log_beta, -1)
        return fir(replicate(y, *down_pad), down_taps.to(y.dtype), ratio)

    return channels_last_1d(x, channels_last)


@anti_aliased_snake.register_fake
def _(x, up_taps, down_taps, log_alpha, log_beta, ratio):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, log_alpha.dtype))


ATTENTION_BLOCK = 1024  # queries a step of the frame-causal scores at once (as models/common/attention.py on a CPU)


@torch.library.custom_op("vae_convert::frame_causal_attention", mutates_args=())
def frame_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, frames: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(C)) v of (B, N, C) tokens that are `frames` frames in order, a token seeing those of its
    own and earlier frames (HunyuanVideo's mask, from frame indices): queries in blocks, each against the keys it
    may see, so memory grows with N, never N x N; in float32, rounded once to q's dtype. The torchax runtime lowers it
    to the Flax models' blocked attention (converter/torchax_runtime.py)."""
    n, per, dtype = q.shape[1], q.shape[1] // frames, q.dtype
    q, k, v = q.float(), k.float(), v.float()
    out = torch.empty_like(q)
    for start in range(0, n, ATTENTION_BLOCK):
        stop = min(start + ATTENTION_BLOCK, n)
        seen = ((stop - 1) // per + 1) * per  # up to the end of the last query's frame
        scores = q[:, start:stop] @ k[:, :seen].transpose(1, 2) / q.shape[-1] ** 0.5
        query_frame = torch.arange(start, stop, device=q.device)[:, None] // per
        scores = scores.masked_fill(torch.arange(seen, device=q.device)[None, :] // per > query_frame, -torch.inf)
        out[:, start:stop] = scores.softmax(-1) @ v[:, :seen]
    return out.to(dtype)


@frame_causal_attention.register_fake
def _(q, k, v, frames):
    return torch.empty_like(q)


@torch.library.custom_op("vae_convert::upsampled_conv", mutates_args=())
def upsampled_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, edge: bool) -> torch.Tensor:
    """The convolution by weight (O, C, *K, 3, 3) of x (B, C, *D, H, W) upsampled by 2 (nearest) in height and
    width and padded by one row and column around, zeros or (`edge`) its edge repeated, D as it is: diffusers'
    upsamplers' convolution. The torchax runtime lowers it as the Flax models compute it: off the CPU by output
    phase, never making the upsampled input (converter/torchax_runtime.py)."""
    upsampled = x.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)
    convolve = F.conv2d if x.ndim == 4 else F.conv3d
    if edge:
        return convolve(F.pad(upsampled, (1, 1, 1, 1, *(0, 0) * (x.ndim - 4)), mode="replicate"), weight, bias)
    return convolve(upsampled, weight, bias, padding=(0,) * (x.ndim - 4) + (1, 1))


@upsampled_conv.register_fake
def _(x, weight, bias, edge):
    window = (size - k + 1 for size, k in zip(x.shape[2:-2], weight.shape[2:-2]))
    return x.new_empty((x.shape[0], weight.shape[0], *window, 2 * x.shape[-2], 2 * x.shape[-1]))


class UpsampledConv2d(nn.Conv2d):
    """A 3x3 convolution, a zero around, of its input upsampled by 2 (nearest): diffusers' upsampler's convolution
    (its parameters), given the input before upsampling."""

    def __init__(self, in_channels, out_channels, bias=True):
        super().__init__(in_channels, out_channels, 3, padding=1, bias=bias)

    def forward(self, x):
        return upsampled_conv(x, self.weight, self.bias, False)


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same parameters), computed in float32 whatever the input dtype. Under torchax, the runtime
    lowers it as one JAX function (converter/torchax_runtime.py)."""

    def forward(self, x):
        return F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(), self.eps).to(x.dtype)


class Attention(nn.Module):
    """diffusers' Attention as the VAEs' mid blocks configure it: GroupNorm first, one head as wide as the channels,
    the input added back. Over an image's pixels (B, C, H, W), or a clip's (B, C, T, H, W) where a token sees its own
    and earlier frames (HunyuanVideo's mask, from frame indices, never a whole N x N matrix). The torchax runtime
    lowers the attention as the Flax models compute it (models/common/attention.py): softmax in float32."""

    def __init__(self, channels, groups):
        super().__init__()
        self.group_norm = GroupNorm(groups, channels, eps=1e-6)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x):
        channels_last = (x.shape[0], *x.shape[2:], x.shape[1])
        tokens = self.group_norm(x).movedim(1, -1).reshape(x.shape[0], -1, x.shape[1])
        frames = x.shape[2] if x.ndim == 5 else 1
        q, k, v = (proj(tokens) for proj in (self.to_q, self.to_k, self.to_v))
        if frames > 1:
            out = frame_causal_attention(q, k, v, frames)
        else:  # one frame: every token sees every other (no mask, so the torchax runtime computes it in blocks)
            out = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        return self.to_out[0](out.to(x.dtype)).reshape(channels_last).movedim(-1, 1) + x
