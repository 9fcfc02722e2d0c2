"""Qwen3 (``Qwen3ForCausalLM``, GGUF ``qwen3``): Qwen2's windows, no q/k/v biases, per-head q/k RMSNorms."""

from __future__ import annotations

from typing import Any

from local_verifier.families.base import Family, GGUFMetadata
from local_verifier.families.qwen2 import windows


def config(raw: dict[str, Any]) -> dict[str, Any]:
    """Qwen3's layer differences."""
    return {**windows(raw), "qk_norm": True}


def gguf_config(meta: GGUFMetadata, common: dict[str, Any]) -> dict[str, Any]:
    """Qwen3's layer differences, from a GGUF file."""
    return {"qk_norm": True}


FAMILY = Family(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    hf_config=config,
    gguf_architectures=("qwen3",),
    gguf_config=gguf_config,
)
