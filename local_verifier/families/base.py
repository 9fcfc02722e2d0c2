"""What a model family is: how its checkpoints map onto the generic decoder."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

GGUFMetadata = Callable[[str], Any]
"""A GGUF file's ``{architecture}.{key}`` metadata value by ``key`` (None where absent)."""


def no_differences(raw: dict[str, Any]) -> dict[str, Any]:
    """The plain Llama layer: no ``ModelConfig`` fields beyond the common ones."""
    return {}


def no_gguf_differences(meta: GGUFMetadata, common: dict[str, Any]) -> dict[str, Any]:
    """The plain Llama layer, from a GGUF file: no fields beyond the common ones."""
    return {}


@dataclass(frozen=True)
class Family:
    """One model family: its Hugging Face and GGUF architecture names, how a ``config.json``
    or a GGUF file's metadata sets the decoder's switches, and the tensors its checkpoints
    name otherwise."""

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
    gguf_architectures: tuple[str, ...] = ()  # ``general.architecture`` values it reads
    gguf_config: Callable[[GGUFMetadata, dict[str, Any]], dict[str, Any]] = no_gguf_differences
    """``ModelConfig`` fields of the family's layer differences from a GGUF file's metadata,
    given the common fields read already (applied over them)."""
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)
    """A layer's GGUF tensors (under ``blk.{i}.``) beyond or unlike Llama's
    (``llama.GGUF_LAYER_TENSORS``) -> the names the decoder reads them by."""
    gguf_interleaved_qk: bool = False
    """llama.cpp's converter stores the q/k rows of each head interleaved for its rope; they
    are read back in rotate-half order."""
    vocab_by_place: bool = False
    """Its GGUF SentencePiece vocabulary's merges rank by place in the vocabulary (its scores
    do not follow the merge order), its tokens of spaces spelt in visible spaces."""
    end_of_turn: str | None = None
    """A token that ends a turn besides the file's end-of-sequence ones, where the vocabulary
    holds it; a GGUF file then without a chat template gets ``chat_template``."""
    chat_template: str | None = None
