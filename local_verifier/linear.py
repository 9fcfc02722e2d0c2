"""A linear layer's parameters: ``y = x @ weight.T + bias``, applied by the step kernels."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from local_verifier.kernels.packing import Layout, is_packed, layout_of, pack, packable, unpack

# the layouts a weight is held in for a wanted one, the first it is packable to
_FALLBACKS: dict[Layout, list[Layout]] = {
    "amx": ["amx", "packed", "row"],
    "packed": ["packed", "row"],
    "row": ["row"],
    "quant": ["row"],
}


class Linear(nn.Module):
    """Weight [out_features, in_features] and optional bias [out_features]. The C++ backend
    holds a bf16 weight packed (``kernels.packing``: the same values, one copy; for the bf16
    kernels where they run); state dicts hold it row-major either way. A GGUF quantized
    weight is held as its blocks (``quant``), in every state."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        row_major_state(self)

    @torch.no_grad()
    def set_layout(self, layout: Layout) -> None:
        """Holds the weight in ``layout`` where ``packable`` (``amx`` else ``packed``), else
        row-major; in place. A ``quant`` weight (GGUF blocks) stays as it is."""
        if layout_of(self.weight.data) == "quant":
            return
        w = unpack(self.weight.data)
        fits = [c for c in _FALLBACKS[layout] if packable(w, c)]
        if layout_of(self.weight.data) != fits[0]:
            self.weight.data = pack(w, fits[0])


def row_major_state(module: Linear | nn.Embedding) -> None:
    """Keeps ``module.weight`` row-major in state dicts whatever layout it is held in (a
    ``Linear``'s, and an embedding tied to a head)."""
    module.register_state_dict_post_hook(_saved_row_major)
    module.register_load_state_dict_pre_hook(_loaded_as_held)


def _saved_row_major(
    module: Linear | nn.Embedding, state: dict[str, Any], prefix: str, *_: Any
) -> None:
    key = prefix + "weight"
    if key in state and is_packed(state[key]):
        state[key] = unpack(state[key])


def _loaded_as_held(
    module: Linear | nn.Embedding, state: dict[str, Any], prefix: str, *_: Any
) -> None:
    key = prefix + "weight"
    if key in state and is_packed(module.weight) and not is_packed(state[key]):
        state[key] = pack(state[key], layout_of(module.weight))
