"""A Llama-family model's parameters as both fused step backends read them: the C++ stack
(``fused.FusedStack``) and the Triton one (``triton_stack.TritonStack``).
``Transformer.stack_weights`` builds it from the model as its parameters are now."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerWeights:
    """One block's parameters."""

    attn_norm: torch.Tensor
    attn_eps: float
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    ffn_eps: float
    w13: torch.Tensor
    w2: torch.Tensor

    def tensors(self) -> list[torch.Tensor | None]:
        """In the C++ stack's table order."""
        return [self.attn_norm, self.wqkv, self.bqkv, self.wo, self.ffn_norm, self.w13, self.w2]


@dataclass(frozen=True)
class StackWeights:
    """The model's parameters and head geometry."""

    embed: torch.Tensor
    layers: Sequence[LayerWeights]
    norm: torch.Tensor
    norm_eps: float
    head: torch.Tensor
    rope_cos: torch.Tensor  # float32 [max_seq_len, head_dim]
    rope_sin: torch.Tensor
    n_heads: int
    n_kv_heads: int
