"""The front-door seam: keys in either header, door-shaped errors before an endpoint
runs, and the transcoder skipped once an endpoint answers natively."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.types import Message

from gateway.call import Api, Call
from gateway.errors import GatewayError
from gateway.front_door import CHAT, answer_send
from sdk.wire import ChatCompletionRequest

CHAT_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "headers",
    [{"authorization": "Bearer alice-key"}, {"x-api-key": "alice-key"}],
    ids=["bearer", "x-api-key"],
)
def test_either_key_header_authenticates(gateway_url: str, headers: dict[str, str]) -> None:
    r = httpx.post(f"{gateway_url}/v1/chat/completions", json=CHAT_BODY, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-api-key": "not-a-key"},
        {"authorization": "Basic alice-key", "x-api-key": "alice-key"},
    ],
    ids=["none", "unknown", "authorization-wins"],
)
def test_a_missing_or_wrong_key_is_401(gateway_url: str, headers: dict[str, str]) -> None:
    r = httpx.post(f"{gateway_url}/v1/chat/completions", json=CHAT_BODY, headers=headers)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"


class _Upper:
    """A door whose transcoder upper-cases every body (stands for a real transcoder)."""

    api: Api = "messages"

    def parse(self, data: dict[str, Any]) -> ChatCompletionRequest:
        return CHAT.parse(data)  # type: ignore[return-value]

    def error_body(self, error: GatewayError) -> bytes:
        return json.dumps({"type": "error", "error": {"message": error.message}}).encode()

    def transcode(self, call: Call, send: Any) -> Any:
        async def upper(message: Message) -> None:
            if "body" in message:
                message = {**message, "body": message["body"].upper()}
            await send(message)

        return upper


def _call() -> Call:
    request = CHAT.parse(CHAT_BODY)
    unused: dict[str, Any] = {"wait": None, "timing": None}
    return Call("messages", "t", b"{}", {}, request, [], [], **unused)


@pytest.mark.parametrize("native", [False, True])
async def test_the_transcoder_is_skipped_for_a_native_answer(native: bool) -> None:
    sent: list[Message] = []

    async def client(message: Message) -> None:
        sent.append(message)

    call = _call()
    send = answer_send(_Upper(), call, client)
    call.native = native  # an endpoint sets it before its first byte
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"answer"})
    assert sent[1]["body"] == (b"answer" if native else b"ANSWER")


def test_an_openai_door_sends_through_the_clients_send() -> None:
    async def client(message: Message) -> None:
        raise AssertionError("not sent")

    assert answer_send(CHAT, _call(), client) is client
    assert CHAT.error_body(GatewayError("boom")) == GatewayError("boom").body()
