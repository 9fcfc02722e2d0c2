"""SmolLM2-135M widened with zeros to a larger Llama shape that computes the same function.

A random-weight checkpoint has a real model's cost but not its behaviour: its greedy text
never repeats the file being edited, so no draft is accepted. Widening the installed
SmolLM2 gives a checkpoint of the larger shape whose text is SmolLM2's:

- each matrix is SmolLM2's in its top-left corner, zeros elsewhere: the hidden state's
  added dimensions stay zero through every layer, the added query heads see zero keys and
  values and write nothing, the added MLP units are ``silu(0) * 0 = 0``;
- the query heads keep their key/value heads (the shape's heads per key/value head must
  be SmolLM2's 3, so that query head ``h``'s ``h // 3`` is unchanged);
- RMSNorm's mean over ``dim`` values of which SmolLM2's ``d`` are non-zero is ``d / dim``
  times SmolLM2's: the norms' weights are scaled by ``sqrt(d / dim)`` and the epsilon by
  ``d / dim``, which gives SmolLM2's normalised values exactly (in exact arithmetic).

The values are SmolLM2's GGUF weights as the package ships them (Q4_1 blocks, dequantized);
the vocabulary is its own 49,152 tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from local_verifier.gguf_loader import read_gguf
from local_verifier.loader import smollm2_path

SOURCE_DIM = 576  # SmolLM2-135M's hidden size
SOURCE_LAYERS = 30
SOURCE_EPS = 1e-5  # its RMSNorm epsilon
GROUP = 3  # its query heads per key/value head


def widened_config(dim: int, heads: int, hidden: int) -> dict[str, Any]:
    """The Hugging Face config of SmolLM2 widened to ``dim`` (head size 64, ``heads`` query
    heads in groups of ``GROUP``) and an MLP of ``hidden`` units."""
    return {
        "hidden_size": dim,
        "num_hidden_layers": SOURCE_LAYERS,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // GROUP,
        "intermediate_size": hidden,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "max_position_embeddings": 8192,
        "rms_norm_eps": SOURCE_EPS * SOURCE_DIM / dim,
        "tie_word_embeddings": True,
    }


def widened_weights(
    shapes: dict[str, tuple[int, ...]], cfg: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The float32 tensors of ``shapes`` (Hugging Face names of a checkpoint with ``cfg``):
    SmolLM2's in each corner, zeros elsewhere, the norms scaled (module docstring)."""
    source_cfg, source, _ = read_gguf(smollm2_path())
    if (
        cfg["num_hidden_layers"] != source_cfg.n_layers
        or cfg["hidden_size"] // cfg["num_attention_heads"] != source_cfg.head_dim
        or cfg["num_attention_heads"] % GROUP
        or cfg["num_attention_heads"] // cfg["num_key_value_heads"] != GROUP
    ):
        raise ValueError("a widened SmolLM2 keeps its layers, head size and head groups")
    scale = math.sqrt(source_cfg.dim / cfg["hidden_size"])
    for name, dims in shapes.items():
        small = source.shape(name)
        if small is None:
            raise ValueError(f"SmolLM2 has no tensor {name}")
        values = torch.empty(small, dtype=torch.float32)
        source.read_into(name, values)
        if name.endswith("norm.weight"):
            values *= scale
        wide = torch.zeros(dims, dtype=torch.float32)
        wide[tuple(slice(0, n) for n in small)] = values
        yield name, wide
