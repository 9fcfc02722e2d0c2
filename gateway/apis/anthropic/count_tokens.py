"""``POST /v1/messages/count_tokens``: the prompt tokens a Messages request would have.

Asked of the model's first endpoint (``Endpoint.count_tokens``): an ``anthropic`` endpoint
asks its provider (the body relayed with the model renamed and the gateway's own key); an
in-process local endpoint counts exactly, with its model's tokenizer and chat template as a
generation renders the prompt (tools included); any other endpoint has no tokenizer here,
so the count is the gateway's estimate, the request's JSON bytes over four (what the rate
limits count).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from gateway.apis.anthropic import errors
from gateway.apis.anthropic.request import to_chat
from gateway.endpoints.endpoint import CountCall, Relayed
from gateway.errors import GatewayError, InvalidJSON, ModelNotFound
from gateway.http.asgi import JSON, ClientDisconnected, header, read_body, send_body
from gateway.http.validation import parse_json_async
from sdk.wire import CountTokensRequest, MessagesRequest, TokenCount

if TYPE_CHECKING:
    from gateway.runtime import Runtime


def _internal(data: dict[str, Any]) -> dict[str, Any]:
    """The internal request of a count's body (``max_tokens`` plays no part in the prompt;
    the translation needs one)."""
    return to_chat(MessagesRequest.model_validate({**data, "max_tokens": 1}))


class CountTokens:
    """The ASGI app of ``POST /v1/messages/count_tokens``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.runtime
        try:
            runtime.auth.tenant(scope)
            settings = runtime.settings
            raw = await read_body(
                receive,
                settings.max_body_bytes,
                header(scope, b"content-length"),
                settings.server.body_timeout_s,
            )
            data = await parse_json_async(raw)
            if not isinstance(data, dict):
                raise InvalidJSON("request body must be a JSON object")
            try:
                counted = CountTokensRequest.model_validate(data)
            except ValidationError as err:
                raise errors.invalid(err, data) from None
            endpoints = runtime.routes.get(counted.model)
            if not endpoints:
                raise ModelNotFound(
                    f"model {counted.model!r} is not served here (see GET /v1/models)",
                    param="model",
                )
            call = CountCall(raw, data, partial(_internal, data))
            answer = await runtime.endpoints[endpoints[0].name].count_tokens(call)
            if isinstance(answer, Relayed):
                status, body = answer.status, answer.body
            else:
                status, body = 200, orjson.dumps(TokenCount(input_tokens=answer).model_dump())
        except ClientDisconnected:
            return
        except GatewayError as error:
            status, body = error.status, errors.error_body(error)
        await send_body(send, status, body, [(b"content-type", JSON)])
