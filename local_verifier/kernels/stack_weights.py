"""A model's parameters as both fused step backends read them: the C++ stack
(``fused.FusedStack``, every family's layer) and the Triton one (``triton_stack.TritonStack``,
the plain Llama layer). ``Transformer.stack_weights`` builds it from the model as its
parameters are now.

A layer is the Llama layer plus the other families' differences as data: per-head q/k norms
(Qwen3, Gemma 3), norms of the attention's and the MLP's outputs (Gemma 3), the activation
(SwiGLU or GeGLU), a sliding window and the rope table of its own base (Mistral, Qwen2/3,
Gemma 3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

ACTIVATIONS = ("silu", "gelu_tanh")  # by their codes in the C++ stack (``Activation``)


class Norm(NamedTuple):
    """An RMSNorm's weight and epsilon."""

    weight: torch.Tensor
    eps: float


@dataclass(frozen=True)
class LayerWeights:
    """One block's parameters and switches."""

    attn_norm: torch.Tensor
    attn_eps: float
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    ffn_eps: float
    w13: torch.Tensor
    w2: torch.Tensor
    q_norm: Norm | None = None  # each query head's, over head_dim
    k_norm: Norm | None = None  # each key head's
    post_attn_norm: Norm | None = None  # the attention's output's, before the residual add
    post_ffn_norm: Norm | None = None  # the MLP's output's
    activation: str = "silu"  # of ``ACTIVATIONS``
    window: int | None = None  # the latest keys a row attends to (None: all)
    local_rope: bool = False  # rotated by the sliding layers' rope table (their own base)
    # where a run of GGUF blocks apart begins with k's, v's or up's rows (``Linear.runs``):
    # that run (wqkv and w13 then hold the first run)
    wqkv_k: torch.Tensor | None = None
    wqkv_v: torch.Tensor | None = None
    w13_up: torch.Tensor | None = None
    qk_pairs: bool = False  # wqkv's q and k rows in a GGUF llama file's pair order

    def tensors(self) -> list[torch.Tensor | None]:
        """In the C++ stack's table order (``LayerTensor``)."""
        extra = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm)
        return [
            self.attn_norm, self.wqkv, self.bqkv, self.wo, self.ffn_norm, self.w13, self.w2,
            *(None if n is None else n.weight for n in extra), self.wqkv_k, self.wqkv_v,
            self.w13_up,
        ]  # fmt: skip

    def eps(self) -> list[float]:
        """The norms' epsilons in the C++ stack's order (``LayerNorm``; 0 for an absent one)."""
        extra = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_ffn_norm)
        return [self.attn_eps, self.ffn_eps, *(0.0 if n is None else n.eps for n in extra)]


@dataclass(frozen=True)
class StackWeights:
    """The model's parameters and head geometry."""

    embed: torch.Tensor
    layers: Sequence[LayerWeights]
    norm: torch.Tensor
    norm_eps: float
    head: torch.Tensor
    rope_cos: torch.Tensor  # float32 [the model's rope_positions, head_dim]
    rope_sin: torch.Tensor
    n_heads: int
    n_kv_heads: int

    def windows(self) -> set[int]:
        """The layers' sliding windows (empty: every layer attends to all its keys)."""
        return {w.window for w in self.layers if w.window is not None}
