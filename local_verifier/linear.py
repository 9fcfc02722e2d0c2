"""A linear layer's parameters: ``y = x @ weight.T + bias``, applied by the step kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from local_verifier.kernels.packing import Layout, is_packed, layout_of, pack, packable, unpack

if TYPE_CHECKING:
    from local_verifier.kernels import StepOps

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
    weight is held as its blocks (``quant``), in every state.

    ``tail``, where not None, holds the last output rows as GGUF blocks apart from
    ``weight``'s, which holds the rows before them: a fused layer's last part of another type
    (Q4_K_M's v and MLP rows), or one the file does not hold right after the others (up,
    after gate and ``ffn_norm``), used in place."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.tail: nn.Parameter | None
        self.register_parameter("tail", None)
        row_major_state(self)

    def forward(self, x: torch.Tensor, ops: StepOps) -> torch.Tensor:
        """``x @ [weight; tail].T + bias`` by ``ops`` (a tail's outputs by its own type's
        kernel, as the fused step computes them)."""
        if self.tail is None:
            return ops.linear(x, self.weight, self.bias)
        head = self.weight.shape[0]
        bias = [None, None] if self.bias is None else [self.bias[:head], self.bias[head:]]
        return torch.cat(
            [ops.linear(x, self.weight, bias[0]), ops.linear(x, self.tail, bias[1])], dim=1
        )

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
