"""The routing key of a request for ``prefix`` routing: its session, else its opening."""

from __future__ import annotations

from gateway.call import Call
from sdk.wire import ChatCompletionRequest

SESSION_HEADER = b"x-draftgate-session"


def routing_key(call: Call, session: bytes | None, prefix_chars: int) -> str:
    """``X-Draftgate-Session`` when the client sent one; else the request's opening cut to
    ``prefix_chars`` characters: for a chat, the messages up to and including the first
    user message (the system prompt and the conversation's first question, the same on
    every later turn); for a completion, the prompt. Requests with the same opening share
    the prefix an endpoint has cached."""
    if session:
        return "session:" + session.decode("latin-1")
    request = call.request
    if isinstance(request, ChatCompletionRequest):
        opening: list[str] = []
        for message in request.messages:
            opening.append(f"{message.role}\x00{message.text()}")
            if message.role == "user" or sum(map(len, opening)) >= prefix_chars:
                break
        return "chat:" + "\x01".join(opening)[:prefix_chars]
    return "prompt:" + call.prompt_text()[:prefix_chars]
