"""PyTorch layers several families share."""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same parameters), computed in float32 whatever the input dtype. Under torchax, the runtime
    lowers it as one JAX function (converter/torchax_runtime.py)."""

    def forward(self, x):
        return F.group_norm(x.float(), self.num_groups, self.weight.float(), self.bias.float(), self.eps).to(x.dtype)
