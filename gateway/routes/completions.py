"""The request pipeline behind every front door (:mod:`gateway.front_door`), as a pure
ASGI app.

Per request: authenticate, read the body (bounded), parse it with the door into the
internal request, apply the limits, route by model, then try the model's endpoints in the order the balancer plans
(:mod:`gateway.routing.balancer`); a failure before the first byte moves to the next. An
HTTP upstream's answer is forwarded as it arrives; a local endpoint runs the engine.
Nothing is retried or failed over once the first byte went to the client.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import httpx
from starlette.types import Receive, Scope, Send

from gateway import prediction_policy
from gateway.call import API_PATHS, Call, apply_usage
from gateway.config import EndpointConfig
from gateway.endpoints.capabilities import CAPABILITIES
from gateway.endpoints.hosted.upstream import UpstreamFailure
from gateway.endpoints.remote.endpoint import REMOTE_VERIFY_HEADER
from gateway.errors import GatewayError, InvalidJSON, ModelNotFound, UpstreamError
from gateway.front_door import Continuing, FrontDoor, answer_send
from gateway.http.asgi import (
    ENDPOINT_HEADER,
    JSON,
    PREDICTION_HEADER,
    ClientDisconnected,
    Headers,
    declared_length,
    header,
    read_body,
    run_until_disconnect,
    send_body,
    send_error,
)
from gateway.http.sse import SSE_HEADERS, EventTooLarge, StreamRelay, error_event
from gateway.http.validation import parse_json_async
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
    run between its steps."""
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
        """Try the endpoints in the balancer's order; ``send`` is the door's answer send,
        ``client_send`` answers the gateway's own error when no endpoint could."""
        balancer = self.runtime.balancer
        key = None
        if balancer.strategy_for(call.request.model) == "prefix":
            key = routing_key(call, session, balancer.config.prefix_chars)
        plan = balancer.plan(call.request.model, endpoints, key)
        failure: UpstreamFailure | None = None
        failed_endpoint = endpoints[0].name
        for index, (endpoint, admitted) in enumerate(plan):
            replica = balancer.replicas[endpoint.name]
            if admitted and not replica.health.acquire():
                continue  # its half-open trial went to another request meanwhile
            call.timing.endpoint = endpoint.name
            with balancer.attempt(endpoint.name) as attempt:
                local = self.runtime.local.get(endpoint.name)
                if local is not None:
                    await local.serve(call, send)
                    return
                remote = self.runtime.remote.get(endpoint.name)
                passthrough = None if remote is None else await remote.serve(call, send)
                if remote is not None and passthrough is None:
                    return
                upstream = self.runtime.upstreams[endpoint.name]
                native = call.api in CAPABILITIES[endpoint.kind].native_apis
                decision, body = await self._prepare(call, endpoint, native)
                call.timing.prediction_status = decision.status
                t0 = time.perf_counter()
                try:
                    response = await upstream.open(
                        API_PATHS[call.api if native else call.openai_api],
                        body,
                        endpoint.upstream_model(call.request.model),
                        call.forward_headers,
                        retry=index == len(plan) - 1,
                    )
                except UpstreamFailure as exc:
                    if exc.client_fault:
                        await self._fail(call, send, exc.to_error(endpoint.name), decision.status)
                        return
                    if exc.endpoint_fault:
                        attempt.failed()
                    failure, failed_endpoint = exc, endpoint.name
                    continue
                finally:
                    call.wait.seconds += time.perf_counter() - t0
                call.timing.t_first_byte = time.perf_counter()
                call.native = native
                headers: Headers = [
                    (PREDICTION_HEADER, decision.status.encode()),
                    (ENDPOINT_HEADER, endpoint.name.encode()),
                ]
                if passthrough is not None:
                    headers.append((REMOTE_VERIFY_HEADER, b"passthrough:" + passthrough.encode()))
                if call.request.stream:
                    await self._relay_stream(call, response, send, headers)
                else:
                    await self._relay_body(call, response, send, headers)
                if call.timing.error is None:
                    attempt.succeeded(time.perf_counter() - t0)
                else:
                    attempt.failed()
                return
        if failure is None:  # every endpoint was skipped: none admitted this request
            failure = UpstreamFailure("no endpoint is available")
        error = failure.to_error(failed_endpoint)
        call.timing.status = error.status
        call.timing.error = error.message
        status = call.timing.prediction_status.encode()
        await send_door_error(client_send, self.door, error, [(PREDICTION_HEADER, status)])

    async def _prepare(
        self, call: Call, endpoint: EndpointConfig, native: bool
    ) -> tuple[prediction_policy.Decision, bytes]:
        upstream_model = endpoint.upstream_model(call.request.model)
        if native:  # the client's own API: only the model is renamed
            body = prediction_policy.upstream_body(
                call.raw,
                call.data,
                upstream_model=upstream_model,
                strip_prediction=False,
                prediction_text=None,
            )
            return prediction_policy.Decision(prediction_policy.NONE), body
        raw, data = call.openai_body()
        decision = prediction_policy.decide(
            call.request,
            CAPABILITIES[endpoint.kind],
            upstream_model=upstream_model,
            doc_ids=call.doc_ids,
            accepts_override=endpoint.accepts_prediction,
            api_version=endpoint.api_version,
        )
        prediction_text = None
        if decision.synthesize:
            prediction_text, missing = await self.runtime.document_text(call.tenant, call.doc_ids)
            if prediction_text is None:
                decision = prediction_policy.Decision(prediction_policy.dropped(missing))
        body = prediction_policy.upstream_body(
            raw,
            data,
            upstream_model=upstream_model,
            strip_prediction=decision.strip_prediction,
            prediction_text=prediction_text,
        )
        return decision, body

    async def _fail(self, call: Call, send: Send, error: GatewayError, status: str) -> None:
        call.timing.status = error.status
        call.timing.error = error.message
        await send_error(send, error, [(PREDICTION_HEADER, status.encode())])

    async def _relay_body(
        self, call: Call, response: httpx.Response, send: Send, headers: Headers
    ) -> None:
        t0 = time.perf_counter()
        limit = self.runtime.settings.max_response_bytes
        try:
            body = await _read_capped(response, limit)
        except ResponseTooLarge:
            await self._fail(
                call,
                send,
                UpstreamError(f"upstream answer is over {limit} bytes", code="response_too_large"),
                call.timing.prediction_status,
            )
            return
        except httpx.TimeoutException:
            await self._fail(
                call,
                send,
                UpstreamError("upstream timed out sending the body", code="gateway_timeout"),
                call.timing.prediction_status,
            )
            return
        except httpx.HTTPError as exc:
            await self._fail(
                call,
                send,
                UpstreamError(f"upstream body interrupted: {type(exc).__name__}"),
                call.timing.prediction_status,
            )
            return
        finally:
            await response.aclose()
            call.wait.seconds += time.perf_counter() - t0
        content_type = response.headers.get("content-type", "application/json").encode()
        call.timing.status = response.status_code
        await send_body(
            send, response.status_code, body, [(b"content-type", content_type), *headers]
        )
        now = time.perf_counter()
        call.timing.t_first_content = call.timing.t_end = now
        try:
            payload = json.loads(body)
        except ValueError:
            return
        if isinstance(payload, dict):
            apply_usage(call.timing, payload.get("usage"))
            if self.runtime.settings.capture:
                call.response_text = _texts(payload)

    async def _relay_stream(
        self, call: Call, response: httpx.Response, send: Send, headers: Headers
    ) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]}
        )
        relay = StreamRelay(call.timing, keep_text=self.runtime.settings.capture)
        problem: str | None = None
        # the transport's byte stream itself: ``aiter_raw`` re-chunks and wraps every chunk
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        try:
            async for chunk in stream:
                ready = relay.feed(chunk)
                if ready:
                    await send({"type": "http.response.body", "body": ready, "more_body": True})
                    relay.observe(ready)
            # a native stream (Messages, Responses) has no [DONE]: its end is the close
            if not relay.done and not call.native:
                problem = "upstream stream ended before [DONE]"
        except EventTooLarge as exc:
            problem = str(exc)
        except httpx.TimeoutException:
            problem = "upstream timed out mid-stream"
        except httpx.HTTPError as exc:
            problem = f"upstream stream interrupted: {type(exc).__name__}"
        finally:
            await response.aclose()
        call.timing.t_end = time.perf_counter()
        apply_usage(call.timing, relay.usage)
        if problem is not None:
            call.timing.status = 502
            call.timing.error = problem
            await send(
                {"type": "http.response.body", "body": error_event(problem), "more_body": True}
            )
        elif relay.text is not None:
            call.response_text = ["".join(relay.text)]
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class ResponseTooLarge(Exception):
    """An upstream answer is longer than the gateway will hold."""


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    """The whole body of ``response``; :class:`ResponseTooLarge` past ``limit`` bytes."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _texts(payload: dict[str, Any]) -> list[str]:
    texts = []
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else choice.get("text")
        if isinstance(text, str) and text:
            texts.append(text)
    return texts
