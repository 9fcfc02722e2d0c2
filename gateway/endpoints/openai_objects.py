"""OpenAI response objects built from the local engine's output (chat.completion,
chat.completion.chunk, text_completion) with Predicted Outputs usage fields. A choice a
stop string ended names it in ``stop_reason``, as vLLM's choices do."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.call import Api, answer_api


def new_id(api: Api) -> str:
    return ("chatcmpl-" if answer_api(api) == "chat" else "cmpl-") + uuid.uuid4().hex


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
        "preemptions": stats.preemptions,
        "prefill_s": round(stats.prefill_s, 6),
        "total_s": round(stats.total_s, 6),
    }


@dataclass(frozen=True)
class ChoiceResult:
    """One finished answer: its text, why it ended (and the stop string that ended it),
    its formatted logprobs (or None), its tool calls (OpenAI ``tool_calls`` entries; with
    calls and no text, ``content`` is null)."""

    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    stop_reason: str | None = None

    def message(self) -> dict[str, Any]:
        """The chat answer's assistant message."""
        content = None if self.tool_calls and not self.text else self.text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.tool_calls:
            message["tool_calls"] = list(self.tool_calls)
        return message


class Logprobs:
    """OpenAI logprobs objects from the engine's ``TokenLogprob`` items: chat's
    ``{"content": [{token, logprob, bytes, top_logprobs}]}`` or the legacy completions'
    ``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets run on per choice)."""

    def __init__(self, api: Api, token_bytes: Callable[[int], bytes]) -> None:
        self.api = answer_api(api)
        self.token_bytes = token_bytes
        self._offsets: dict[int, int] = {}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token_id)
        return {"token": raw.decode(errors="replace"), "logprob": logprob, "bytes": list(raw)}

    def format(self, items: Sequence[Any], index: int = 0) -> dict[str, Any]:
        """The logprobs object for ``items`` (the next tokens of choice ``index``)."""
        if self.api == "chat":
            content = [
                {
                    **self._token(lp.token_id, lp.logprob),
                    "top_logprobs": [self._token(t, v) for t, v in lp.top],
                }
                for lp in items
            ]
            return {"content": content, "refusal": None}
        tokens = [self._token(lp.token_id, lp.logprob)["token"] for lp in items]
        offsets: list[int] = []
        offset = self._offsets.get(index, 0)
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        self._offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in items],
            "top_logprobs": [{self._token(t, v)["token"]: v for t, v in lp.top} for lp in items],
            "text_offset": offsets,
        }


class ResponseBuilder:
    """Builds one response's objects; ``id``/``created``/``model`` are shared by its chunks."""

    def __init__(self, api: Api, model: str) -> None:
        self.api = answer_api(api)
        self.id = new_id(api)
        self.created = int(time.time())
        self.model = model

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def complete(self, choices: Sequence[ChoiceResult], stats: Any) -> dict[str, Any]:
        """The non-streamed answer (``stats``: every choice's together)."""
        if self.api == "chat":
            head = self._head("chat.completion")
            body = [
                {
                    "index": i,
                    "message": c.message(),
                    "finish_reason": c.finish_reason,
                    "logprobs": c.logprobs,
                }
                for i, c in enumerate(choices)
            ]
        else:
            head = self._head("text_completion")
            body = [
                {
                    "index": i,
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "logprobs": c.logprobs,
                }
                for i, c in enumerate(choices)
            ]
        for choice, c in zip(body, choices, strict=True):
            if c.stop_reason is not None:
                choice["stop_reason"] = c.stop_reason
        return {**head, "choices": body, "usage": usage(stats), "draftgate": draft_stats(stats)}

    def chunk(
        self,
        text: str | None = None,
        *,
        role: bool = False,
        finish: str | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        stop_reason: str | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk of choice ``index``: the role opener, a content delta (with
        its tokens' logprobs), tool-call deltas (chat), or the finishing chunk (with the
        stop string that ended the answer)."""
        if self.api == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta = {"role": "assistant", "content": ""}
            elif text is not None:
                delta = {"content": text}
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "finish_reason": finish,
                "logprobs": logprobs,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {
                "index": index,
                "text": text or "",
                "finish_reason": finish,
                "logprobs": logprobs,
            }
            obj = "text_completion"
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        return {**self._head(obj), "choices": [choice]}

    def usage_chunk(self, stats: Any) -> dict[str, Any]:
        """The final chunk of ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.api == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(stats)}
