"""One proxied request's context, shared by the front door and every endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from gateway.http.asgi import Headers, UpstreamWait
from gateway.telemetry import RequestTiming
from sdk.wire import ChatCompletionRequest, CompletionRequest

Api = Literal["chat", "completions", "messages", "responses"]
# each API's path below an upstream's base URL
API_PATHS: dict[str, str] = {
    "chat": "chat/completions",
    "completions": "completions",
    "messages": "messages",
    "responses": "responses",
}


def answer_api(api: Api) -> Api:
    """The OpenAI API a non-native endpoint answers a front door's request in: completions
    for the completions door, chat for every other (only that door's internal request is a
    ``CompletionRequest``)."""
    return "completions" if api == "completions" else "chat"


@dataclass
class Call:
    """What the gateway knows about one request once it is validated.

    ``api`` is the front door's API and ``raw``/``data`` the body as the client sent it;
    ``request`` is the internal OpenAI request every endpoint can answer. An endpoint that
    relays ``raw`` to an upstream speaking ``api`` itself sets ``native`` before its first
    byte: the front door's transcoder is then skipped. An endpoint that counts the prompt
    before its first byte sets ``prompt_tokens`` (and ``cached_tokens``, those of them its
    prefix cache held) by then, for a door that reports them at a stream's start."""

    api: Api
    tenant: str
    raw: bytes
    data: dict[str, Any]
    request: ChatCompletionRequest | CompletionRequest
    doc_ids: list[str]
    forward_headers: Headers
    wait: UpstreamWait
    timing: RequestTiming
    response_text: list[str] = field(default_factory=list)
    native: bool = False
    tries_left: int = 0  # endpoints the route tries after the current one
    prompt_tokens: int | None = None
    cached_tokens: int = 0

    @property
    def openai_api(self) -> Api:
        """The OpenAI API of the internal request (what a non-native endpoint answers)."""
        return answer_api(self.api)

    def openai_body(self) -> tuple[bytes, dict[str, Any]]:
        """The internal request as an OpenAI body: the client's own for the OpenAI doors,
        else the internal request encoded (the fields the door set, extras included)."""
        if self.api in ("chat", "completions"):
            return self.raw, self.data
        data = self.request.model_dump(mode="json", exclude_unset=True)
        return orjson.dumps(data), data

    def prompt_text(self) -> str:
        """The prompt as plain text (for selecting documents mentioned in it)."""
        request = self.request
        if isinstance(request, ChatCompletionRequest):
            return "\n".join(m.text() for m in request.messages)
        prompt = request.prompt
        if isinstance(prompt, str):
            return prompt
        return "\n".join(p for p in prompt if isinstance(p, str))


def apply_usage(timing: RequestTiming, usage: Any) -> None:
    """Copy an OpenAI ``usage`` object's counts into the request's timing."""
    if not isinstance(usage, dict):
        return
    completion = usage.get("completion_tokens")
    if isinstance(completion, int):
        timing.output_tokens = completion
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int):
        timing.prompt_tokens = prompt
    details = usage.get("completion_tokens_details")
    if isinstance(details, dict):
        accepted = details.get("accepted_prediction_tokens")
        rejected = details.get("rejected_prediction_tokens")
        if isinstance(accepted, int):
            timing.accepted_prediction_tokens = accepted
        if isinstance(rejected, int):
            timing.rejected_prediction_tokens = rejected
