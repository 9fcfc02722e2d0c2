"""Qwen2 (``Qwen2ForCausalLM``, GGUF ``qwen2``): the Llama layer with q/k/v biases; sliding windows only where
``use_sliding_window`` is set, on the layers from ``max_window_layers`` on."""

from __future__ import annotations

from typing import Any

from local_verifier.families.base import Family


def windows(raw: dict[str, Any]) -> dict[str, Any]:
    """The sliding-window fields of a Qwen ``config.json``."""
    window = raw.get("sliding_window")
    if window is None or not raw.get("use_sliding_window"):
        return {"sliding_window": None, "layer_types": None}
    types = raw.get("layer_types")
    if types is None:
        first = int(raw.get("max_window_layers", 0))
        types = [
            "sliding_attention" if i >= first else "full_attention"
            for i in range(raw["num_hidden_layers"])
        ]
    return {"sliding_window": int(window), "layer_types": tuple(types)}


FAMILY = Family(
    name="qwen2",
    hf_architectures=("Qwen2ForCausalLM",),
    hf_config=windows,
    qkv_bias=True,
    gguf_architectures=("qwen2",),
)
