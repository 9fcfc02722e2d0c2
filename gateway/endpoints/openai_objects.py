"""OpenAI response objects built from the local engine's output (chat.completion,
chat.completion.chunk, text_completion) with Predicted Outputs usage fields."""

from __future__ import annotations

import time
import uuid
from typing import Any

from gateway.call import Api


def new_id(api: Api) -> str:
    return ("chatcmpl-" if api == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(stats: Any) -> dict[str, Any]:
    """OpenAI ``usage`` from a ``GenerationStats``."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": getattr(stats, "cached_tokens", 0)},
        "completion_tokens_details": {
            "accepted_prediction_tokens": stats.accepted_prediction_tokens or 0,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens or 0,
            "reasoning_tokens": 0,
        },
    }


def draft_stats(stats: Any) -> dict[str, Any]:
    """draftgate's extension object: what drafting and verification did."""
    return {
        "verify_steps": stats.verify_steps,
        "drafted_tokens": stats.drafted_tokens,
        "accepted_tokens": stats.accepted_tokens,
        "accepted_by_position": list(stats.accepted_by_position),
        "accepted_by_source": dict(stats.accepted_by_source),
        "drafted_by_source": dict(stats.drafted_by_source),
        "prefill_s": round(stats.prefill_s, 6),
        "total_s": round(stats.total_s, 6),
    }


class ResponseBuilder:
    """Builds one response's objects; ``id``/``created``/``model`` are shared by its chunks."""

    def __init__(self, api: Api, model: str) -> None:
        self.api = api
        self.id = new_id(api)
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def complete(self, text: str, stats: Any) -> dict[str, Any]:
        """The non-streamed answer."""
        if self.api == "chat":
            head = self._head("chat.completion")
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": stats.finish_reason,
                "logprobs": None,
            }
        else:
            head = self._head("text_completion")
            choice = {
                "index": 0,
                "text": text,
                "finish_reason": stats.finish_reason,
                "logprobs": None,
            }
        return {**head, "choices": [choice], "usage": usage(stats), "draftgate": draft_stats(stats)}

    def chunk(
        self, text: str | None = None, *, role: bool = False, finish: str | None = None
    ) -> dict[str, Any]:
        """One streamed chunk: the role opener, a content delta, or the finishing chunk."""
        if self.api == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": ""}
            elif text is not None:
                delta = {"content": text}
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "finish_reason": finish,
                "logprobs": None,
            }
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, stats: Any) -> dict[str, Any]:
        """The final chunk of ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(stats)}
