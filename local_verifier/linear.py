"""A linear layer's parameters: ``y = x @ weight.T + bias``, applied by the step kernels."""

from __future__ import annotations

from collections.abc import Sequence
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


RUNS = ("weight", "run1", "run2")  # a ``Linear``'s parameters holding its runs, in order


def split_runs(parts: list[str], first_parts: Sequence[int]) -> list[list[str]]:
    """``parts`` (in order) cut into runs beginning at ``first_parts``."""
    ends = [*first_parts[1:], len(parts)]
    return [parts[a:b] for a, b in zip(first_parts, ends, strict=True)]


class Linear(nn.Module):
    """Weight [out_features, in_features] and optional bias [out_features]. The C++ backend
    holds a bf16 weight packed (``kernels.packing``: the same values, one copy; for the bf16
    kernels where they run); state dicts hold it row-major either way. A GGUF quantized
    weight is held as its blocks (``quant``), in every state.

    A fused layer of GGUF blocks whose parts do not lie in the file as one run of one type
    (Q4_K_M's v and MLP rows in Q6_K; llama.cpp's order k, wo, q, v and gate, ``ffn_norm``,
    up) is held in runs, each used where the file holds it: ``weight`` the first run's rows,
    ``run1`` and ``run2`` (None: absent) the next ones', ``first_parts`` the part each run
    begins with."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.run1: nn.Parameter | None
        self.run2: nn.Parameter | None
        self.register_parameter("run1", None)
        self.register_parameter("run2", None)
        self.first_parts: tuple[int, ...] = (0,)
        row_major_state(self)

    def runs(self) -> list[torch.Tensor]:
        """The weight's runs of rows in order (``weight`` alone unless held in runs)."""
        return [w for w in (getattr(self, name) for name in RUNS) if w is not None]

    def runs_by_part(self, parts: int) -> list[torch.Tensor | None]:
        """For each of the layer's ``parts``, the run that begins with it, else None."""
        out: list[torch.Tensor | None] = [None] * parts
        for first, run in zip(self.first_parts, self.runs(), strict=True):
            out[first] = run
        return out

    def forward(self, x: torch.Tensor, ops: StepOps) -> torch.Tensor:
        """``x @ [weight; run1; run2].T + bias`` by ``ops`` (each run's outputs by its own
        type's kernel, as the fused step computes them)."""
        runs = self.runs()
        if len(runs) == 1:
            return ops.linear(x, self.weight, self.bias)
        outs, row = [], 0
        for run in runs:
            bias = None if self.bias is None else self.bias[row : row + run.shape[0]]
            outs.append(ops.linear(x, run, bias))
            row += run.shape[0]
        return torch.cat(outs, dim=1)

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
