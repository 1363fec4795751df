"""PyTorch layers several families share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def pad_edges(x, pads):
    """x (B, C, T, H, W) padded by repeating its edge frames, rows and columns: `pads` is (before, after) for T, H
    and W. Padded channels-last, the layout the convolutions read under torchax (converter/torchax_runtime.py): XLA
    then materialises the padded input as they read it, not transposed."""
    last = x.permute(0, 2, 3, 4, 1)
    for axis, (before, after) in enumerate(pads, start=1):
        if before or after:
            last = torch.cat([_edge(last, axis, 0, before), last, _edge(last, axis, -1, after)], dim=axis)
    return last.permute(0, 4, 1, 2, 3)


def _edge(x, axis, index, copies):
    """`copies` of x's slice `index` (0 or -1) along `axis`, broadcast as jnp.pad's edge mode does: sliced once per
    copy instead, XLA fuses the activation before the padding (a SiLU) into the concatenation and recomputes it."""
    edge = x.narrow(axis, index % x.shape[axis], 1)
    return edge.expand(*x.shape[:axis], copies, *x.shape[axis + 1 :])


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same parameters), computed in float32 whatever the input dtype. Under torchax, the runtime
    lowers it as one JAX function (converter/torchax_runtime.py)."""

    def forward(self, x):
        return F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(), self.eps).to(x.dtype)
