"""Cached-token counts removed from an engine's answers.

``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang) and SGLang's
``sglext.cached_tokens_details`` say how much of a prompt the engine's prefix cache held.
Where the cache is shared, one tenant can test guesses of another's prompt token by token
through them, so the relay of a multi-tenant engine removes them from JSON answers and
from the events of a stream.
"""

from __future__ import annotations

from typing import Any

import orjson

MARK = b"cached_tokens"  # in every field removed: answers without it pass untouched


def scrub(answer: dict[str, Any]) -> bool:
    """Remove the counts from one answer object (a body or a stream chunk); whether any
    was there. A ``prompt_tokens_details`` left empty becomes ``null``, as vLLM answers
    when it reports no details."""
    removed = False
    usage = answer.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and "cached_tokens" in details:
            del details["cached_tokens"]
            if not details:
                usage["prompt_tokens_details"] = None
            removed = True
    ext = answer.get("sglext")
    if isinstance(ext, dict) and "cached_tokens_details" in ext:
        del ext["cached_tokens_details"]
        removed = True
    return removed


def scrub_body(body: bytes) -> bytes:
    """A JSON answer without the counts (``body`` itself when it has none)."""
    if MARK not in body:
        return body
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if isinstance(answer, dict) and scrub(answer):
        return orjson.dumps(answer)
    return body


def scrub_events(ready: bytes) -> bytes:
    """Whole SSE events without the counts: each ``data:`` line that carries them is
    re-encoded (both engines write one JSON object per line), every other byte kept."""
    if MARK not in ready:
        return ready
    lines = ready.split(b"\n")
    for i, line in enumerate(lines):
        if not line.startswith(b"data:") or MARK not in line:
            continue
        end = b"\r" if line.endswith(b"\r") else b""
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and scrub(event):
            lines[i] = b"data: " + orjson.dumps(event) + end
    return b"\n".join(lines)
