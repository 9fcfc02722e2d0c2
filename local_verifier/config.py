"""The shape and numerics of a decoder (Llama, Mistral, Qwen2/3, Gemma 3), shared by the model
and its KV storage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ModelConfig:
    """Shape and numerics of a decoder.

    The Llama layer is the base; the other families switch on parts of it: per-head q/k
    RMSNorms (Qwen3, Gemma 3), norms after attention and MLP (Gemma 3), GeGLU
    (``activation="gelu_tanh"``), a scaled embedding, and sliding-window attention on the
    layers ``layer_types`` marks ``"sliding_attention"`` (every layer where it is None and
    ``sliding_window`` is set), rotated with ``rope_local_theta`` where that is set."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    max_seq_len: int = 2048
    qk_norm: bool = False
    post_norms: bool = False
    activation: str = "silu"  # or "gelu_tanh" (GeGLU)
    embed_scale: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None

    def window(self, layer: int) -> int | None:
        """The number of latest keys ``layer`` attends to (None: all)."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    @property
    def llama_layers(self) -> bool:
        """Whether every layer is the plain Llama layer over one key list and one rope (what
        the Triton step runs as one graph; the fused C++ stack runs every family)."""
        plain = not (self.qk_norm or self.post_norms) and self.activation == "silu"
        one_window = len({self.window(i) for i in range(self.n_layers)}) <= 1
        return plain and one_window and self.rope_local_theta is None
