"""``POST /v1/messages/count_tokens``: the prompt tokens a Messages request would have.

By the model's first endpoint: an ``anthropic`` endpoint is asked itself (the body relayed
with the model renamed and the gateway's own key); an in-process local endpoint counts
exactly, with its model's tokenizer and chat template as a generation renders the prompt
(tools included); any other endpoint has no tokenizer here, so the count is the gateway's
estimate, the request's JSON bytes over four (what the rate limits count).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx
import orjson
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from gateway import prediction_policy
from gateway.apis.anthropic import errors
from gateway.apis.anthropic.request import to_chat
from gateway.config import EndpointConfig
from gateway.endpoints.hosted.upstream import UpstreamFailure
from gateway.errors import GatewayError, InvalidJSON, ModelNotFound, UpstreamError
from gateway.http.asgi import JSON, ClientDisconnected, header, read_body, send_body
from gateway.http.validation import parse_json_async
from gateway.limits import prompt_tokens
from sdk.wire import ChatCompletionRequest, CountTokensRequest, MessagesRequest, TokenCount

if TYPE_CHECKING:
    from gateway.runtime import Runtime
    from local_verifier.tokenizer import Tokenizer

PATH = "messages/count_tokens"
MAX_ANSWER_BYTES = 64 * 1024  # a count is a few bytes; a longer answer is no count


def local_prompt_ids(request: ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids as the local endpoint renders ``request`` for generation:
    the tools by the model's template where it renders them, else the engine's messages
    through the template."""
    from gateway.endpoints.local.tools import plan

    tools = plan(request, tokenizer.chat_template, None)
    if tools is not None and tools.template:
        return tools.render(tokenizer)
    messages = (
        tools.messages
        if tools is not None
        else [{"role": m.role, "content": m.text()} for m in request.messages]
    )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


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
            endpoint = endpoints[0]
            if endpoint.kind == "anthropic":
                status, body = await self._relay(endpoint, raw, data)
            else:
                count = await self._count(endpoint, data)
                status, body = 200, orjson.dumps(TokenCount(input_tokens=count).model_dump())
        except ClientDisconnected:
            return
        except GatewayError as error:
            status, body = error.status, errors.error_body(error)
        await send_body(send, status, body, [(b"content-type", JSON)])

    async def _count(self, endpoint: EndpointConfig, data: dict[str, Any]) -> int:
        # max_tokens plays no part in the prompt; the translation needs one
        internal = to_chat(MessagesRequest.model_validate({**data, "max_tokens": 1}))
        request = ChatCompletionRequest.model_validate(internal)
        local = self.runtime.local.get(endpoint.name)
        if local is None:
            shown = {"messages": internal["messages"], "tools": internal.get("tools")}
            return prompt_tokens(len(orjson.dumps(shown)))
        engine = await local.engine()
        ids = await asyncio.to_thread(local_prompt_ids, request, engine.tokenizer)
        return len(ids)

    async def _relay(
        self, endpoint: EndpointConfig, raw: bytes, data: dict[str, Any]
    ) -> tuple[int, bytes]:
        upstream = self.runtime.upstreams[endpoint.name]
        model = endpoint.upstream_model(data["model"])
        body = prediction_policy.upstream_body(
            raw, data, upstream_model=model, strip_prediction=False, prediction_text=None
        )
        try:
            response = await upstream.open(PATH, body, model)
        except UpstreamFailure as exc:
            raise exc.to_error(endpoint.name) from None
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise UpstreamError(f"endpoint {endpoint.name!r} answered no token count")
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream body interrupted: {type(exc).__name__}") from None
        finally:
            await response.aclose()
        return response.status_code, b"".join(chunks)
