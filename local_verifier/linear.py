"""A linear layer's parameters: ``y = x @ weight.T + bias``, applied by the step kernels."""

from __future__ import annotations

import torch
from torch import nn

from local_verifier.kernels.packing import is_packed, pack, packable, unpack


class Linear(nn.Module):
    """Weight [out_features, in_features] and optional bias [out_features]. The C++ backend
    holds the weight packed (``kernels.packing``): the same values, one copy."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @torch.no_grad()
    def set_packed(self, packed: bool) -> None:
        """Holds the weight packed (where its shape allows) or row-major, in place."""
        w = self.weight.data
        if packed and packable(w):
            self.weight.data = pack(w)
        elif not packed and is_packed(w):
            self.weight.data = unpack(w)
