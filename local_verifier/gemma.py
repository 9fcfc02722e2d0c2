"""Gemma 3's implicit facts under the names the GGUF reader and tokenizer import (their
home is ``local_verifier.families.gemma3``)."""

from __future__ import annotations

from local_verifier.families.gemma3 import (
    CHAT_TEMPLATE,
    END_OF_TURN,
    LOCAL_ROPE_THETA,
    SLIDING_PATTERN,
    layer_types,
)

__all__ = ["CHAT_TEMPLATE", "END_OF_TURN", "LOCAL_ROPE_THETA", "SLIDING_PATTERN", "layer_types"]
