"""A linear layer's parameters: ``y = x @ weight.T + bias``, applied by the step kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from local_verifier.kernels.packing import is_packed, pack, packable, unpack


class Linear(nn.Module):
    """Weight [out_features, in_features] and optional bias [out_features]. The C++ backend
    holds a bf16 weight packed (``kernels.packing``: the same values, one copy); state dicts
    hold it row-major either way."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_state_dict_post_hook(_saved_row_major)
        self.register_load_state_dict_pre_hook(_loaded_as_held)

    @torch.no_grad()
    def set_packed(self, packed: bool) -> None:
        """Holds the weight packed (where ``packable``) or row-major, in place."""
        w = self.weight.data
        if packed and packable(w):
            self.weight.data = pack(w)
        elif not packed and is_packed(w):
            self.weight.data = unpack(w)


def _saved_row_major(module: Linear, state: dict[str, Any], prefix: str, *_: Any) -> None:
    key = prefix + "weight"
    if key in state and is_packed(state[key]):
        state[key] = unpack(state[key])


def _loaded_as_held(module: Linear, state: dict[str, Any], prefix: str, *_: Any) -> None:
    key = prefix + "weight"
    if key in state and is_packed(module.weight) and not is_packed(state[key]):
        state[key] = pack(state[key])
