"""The routing key of a request for ``prefix`` routing: its session, else its prompt's start."""

from __future__ import annotations

from gateway.call import Call

SESSION_HEADER = b"x-draftgate-session"


def routing_key(call: Call, session: bytes | None, prefix_chars: int) -> str:
    """``X-Draftgate-Session`` when the client sent one (every turn of a conversation then
    lands on the same endpoint), else the first ``prefix_chars`` characters of the prompt
    (messages' text joined): requests that share them share the endpoint's prefix cache."""
    if session:
        return "session:" + session.decode("latin-1")
    return "prompt:" + call.prompt_text()[:prefix_chars]
