"""The request pipeline behind every front door (:mod:`gateway.front_door`), as a pure
ASGI app.

Per request: authenticate, read the body (bounded), parse it with the door into the
internal request, apply the limits, route by model, then hand the request to the model's
endpoints (:mod:`gateway.endpoints.endpoint`) in the order the balancer plans
(:mod:`gateway.routing.balancer`); one that cannot answer before its first byte passes it
to the next. Nothing is retried or failed over once the first byte went to the client.
No upstream is talked to here: that is the endpoints' job.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from gateway import prediction_policy
from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.endpoints.endpoint import Unavailable
from gateway.errors import GatewayError, InvalidJSON, ModelNotFound, UpstreamError
from gateway.front_door import Continuing, FrontDoor, answer_send
from gateway.http.asgi import (
    JSON,
    PREDICTION_HEADER,
    ClientDisconnected,
    Headers,
    declared_length,
    header,
    read_body,
    run_until_disconnect,
    send_body,
)
from gateway.http.validation import YIELD_BYTES, parse_json_async
from gateway.limits import Lease, prompt_tokens
from gateway.routing.key import SESSION_HEADER, routing_key
from gateway.telemetry import RequestTiming
from sdk.wire import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from gateway.runtime import Runtime

DOCUMENTS_HEADER = b"x-draftgate-documents"
# client headers that may travel upstream (never Authorization, Host, cookies, ...)
# (anthropic-beta: the Messages API features a client asks an anthropic endpoint for)
FORWARDED_HEADERS = frozenset(
    {
        b"user-agent",
        b"x-request-id",
        b"traceparent",
        b"tracestate",
        b"accept-language",
        b"anthropic-beta",
    }
)
CLIENT_CLOSED = 499


async def parse_request(
    door: FrontDoor, raw: bytes, max_documents: int
) -> tuple[dict[str, Any], ChatCompletionRequest | CompletionRequest]:
    """The body as a dict and as the door's internal request (400 naming the field if not;
    too many document ids are refused before the body is parsed where the bytes show
    them, else before the rest is validated). A long body's parse lets the event loop
    run between its steps (and between the body's read and that count)."""
    if len(raw) > YIELD_BYTES:
        await asyncio.sleep(0)
    prediction_policy.check_raw_document_count(raw, max_documents)
    data = await parse_json_async(raw)
    if not isinstance(data, dict):
        raise InvalidJSON("request body must be a JSON object")
    prediction_policy.check_document_count(data, max_documents)
    return data, door.parse(data)


async def send_door_error(
    send: Send, door: FrontDoor, error: GatewayError, headers: Headers | None = None
) -> None:
    """``error`` answered in the door's own error shape."""
    extra = [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send_body(
        send,
        error.status,
        door.error_body(error),
        [(b"content-type", JSON), *extra, *(headers or [])],
    )


def _token_limit(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    if isinstance(request, ChatCompletionRequest):
        return request.token_limit()
    return request.max_tokens


class CompletionsRoute:
    """The ASGI app behind one front door's route."""

    def __init__(self, runtime: Runtime, door: FrontDoor) -> None:
        self.runtime = runtime
        self.door = door
        self.continuing = door if isinstance(door, Continuing) else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.runtime
        wait = scope["draftgate.wait"]
        lease: Lease | None = None
        try:
            tenant = runtime.auth.tenant(scope)
            limit, length = runtime.settings.max_body_bytes, header(scope, b"content-length")
            declared = declared_length(length, limit)
            docs_header = header(scope, DOCUMENTS_HEADER)
            prediction_policy.check_header_document_count(
                docs_header, runtime.corpus.select_max_ids
            )
            # counted before the body is read (from its declared length) and parsed: a
            # tenant's big bodies spend its own budget, and one it cannot pay for is not read
            lease = await runtime.limiter.admit(tenant, prompt_tokens(declared or 0))
            raw = await read_body(receive, limit, length, runtime.settings.server.body_timeout_s)
            if declared is None:
                await runtime.limiter.charge(tenant, prompt_tokens(len(raw)))
            data, request = await parse_request(self.door, raw, runtime.corpus.select_max_ids)
            if self.continuing is not None:
                sent = len(raw)
                raw, data, request = await self.continuing.resolve(tenant, raw, data, request)
                # a continued conversation's stored part is paid for as if sent
                await runtime.limiter.charge(tenant, prompt_tokens(max(0, len(raw) - sent)))
            endpoints = runtime.routes.get(request.model)
            if not endpoints:
                raise ModelNotFound(
                    f"model {request.model!r} is not served here (see GET /v1/models)",
                    param="model",
                )
            # every answer may run to its bound: n of them are paid for up front
            requested = _token_limit(request)
            await runtime.limiter.charge(
                tenant, (request.n or 1) * max(e.answer_tokens(requested) for e in endpoints)
            )
            doc_ids = prediction_policy.document_ids(
                request,
                docs_header.decode("latin-1") if docs_header else None,
                runtime.corpus.select_max_ids,
            )
        except (ClientDisconnected, GatewayError) as error:
            if lease is not None:
                await runtime.limiter.release(lease)
            if isinstance(error, GatewayError):
                await send_door_error(send, self.door, error)
            return
        session = header(scope, SESSION_HEADER)
        call = Call(
            api=self.door.api,
            tenant=tenant,
            raw=raw,
            data=data,
            request=request,
            doc_ids=doc_ids,
            forward_headers=[(k, v) for k, v in scope["headers"] if k in FORWARDED_HEADERS],
            wait=wait,
            timing=RequestTiming(
                endpoint=endpoints[0].name,
                model=request.model,
                stream=request.stream,
                t_start=wait.t_start,
            ),
        )
        answer = answer_send(self.door, call, send)
        try:
            if await run_until_disconnect(
                receive, lambda: self._serve(call, endpoints, answer, send, session)
            ):
                call.timing.status = CLIENT_CLOSED
                call.timing.error = "client disconnected"
        finally:
            await runtime.limiter.release(lease)
            if call.timing.t_end is None:
                call.timing.t_end = time.perf_counter()
            runtime.telemetry.record(call.timing)
        if runtime.settings.capture and call.timing.status == 200 and call.response_text:
            await runtime.capture(call)

    async def _serve(
        self,
        call: Call,
        endpoints: tuple[EndpointConfig, ...],
        send: Send,
        client_send: Send,
        session: bytes | None,
    ) -> None:
        """Hand ``call`` to the endpoints in the balancer's order until one answers;
        ``send`` is the door's answer send, ``client_send`` answers the gateway's own error
        when none could."""
        runtime = self.runtime
        balancer = runtime.balancer
        key = None
        if balancer.strategy_for(call.request.model) == "prefix":
            key = routing_key(call, session, balancer.config.prefix_chars)
        plan = balancer.plan(call.request.model, endpoints, key)
        error: GatewayError | None = None
        for index, (config, admitted) in enumerate(plan):
            replica = balancer.replicas[config.name]
            if admitted and not replica.health.acquire():
                continue  # its half-open trial went to another request meanwhile
            call.timing.endpoint = config.name
            call.tries_left = len(plan) - 1 - index
            with balancer.attempt(config.name) as attempt:
                try:
                    served = await runtime.endpoints[config.name].serve(call, send)
                except Unavailable as exc:
                    if exc.endpoint_fault:
                        attempt.failed()
                    error = exc.error
                    continue
                if served is not None:
                    if served.healthy:
                        attempt.succeeded(served.latency_s)
                    else:
                        attempt.failed()
                return
        if error is None:  # every endpoint was skipped: none admitted this request
            error = UpstreamError(
                f"endpoint {endpoints[0].name!r} failed: no endpoint is available"
            )
        call.timing.status = error.status
        call.timing.error = error.message
        status = call.timing.prediction_status.encode()
        await send_door_error(client_send, self.door, error, [(PREDICTION_HEADER, status)])
