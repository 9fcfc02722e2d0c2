"""One proxied request's context, shared by the HTTP upstream and local paths."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.http.asgi import Headers, UpstreamWait
from gateway.telemetry import RequestTiming
from sdk.wire import ChatCompletionRequest, CompletionRequest

Api = Literal["chat", "completions"]
API_PATHS: dict[str, str] = {"chat": "chat/completions", "completions": "completions"}


@dataclass
class Call:
    """What the gateway knows about one completion request once it is validated."""

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
