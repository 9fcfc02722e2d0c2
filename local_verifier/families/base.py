"""What a model family is: how its checkpoints map onto the generic decoder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def no_differences(raw: dict[str, Any]) -> dict[str, Any]:
    """The plain Llama layer: no ``ModelConfig`` fields beyond the common ones."""
    return {}


@dataclass(frozen=True)
class Family:
    """One model family: its Hugging Face architecture names, how its ``config.json`` sets
    the decoder's switches, and the tensors its checkpoints name otherwise."""

    name: str
    hf_architectures: tuple[str, ...]
    hf_config: Callable[[dict[str, Any]], dict[str, Any]] = no_differences
    """``ModelConfig`` fields of the family's layer differences, from its ``config.json``
    (applied over the common fields)."""
    qkv_bias: bool = False  # ``attention_bias`` where config.json leaves it out
    tie_embeddings: bool = False  # ``tie_word_embeddings`` where config.json leaves it out
    offset_norms: bool = False  # the checkpoint's norm weights w apply as (1 + w)
    hf_name: Callable[[str], str] | None = field(default=None)
    """A decoder tensor name (``families.tensor_names``) -> the checkpoint's name for it
    (None: the same name)."""
