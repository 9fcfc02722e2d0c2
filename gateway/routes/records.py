"""``GET /v1/endpoints`` (speculation records), ``POST /v1/endpoints/probe`` (probe them
first), ``GET /v1/endpoints/{name}/memory`` (a local endpoint's memory) and
``POST /v1/audits`` (run an audit through this gateway).

Probes and audits need an admin key (anyone, with no keys configured), and so do the
records and memory, which show every tenant's traffic (unless ``metrics_public``); probes
and audits call this
gateway in process (:class:`AppTransport`): nothing in a request decides where they
connect. One audit runs at a time; one probe run per endpoint; an audit stops when its
client goes away.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.audit.app_transport import IN_PROCESS_URL, AppTransport
from gateway.errors import Conflict, GatewayError, InvalidRequest, NotFound, ServiceUnavailable
from gateway.http.asgi import read_body, run_until_disconnect
from gateway.http.responses import json_response
from gateway.http.validation import parse_json, validate
from gateway.records.service import model_names
from gateway.runtime import Runtime
from lookup.corpus.errors import StoreUnavailable
from sdk.wire.endpoints import AuditRequest, AuditResult, EndpointList

PROBE_TIMEOUT_S = 300.0
ADMIN_ROUTES = frozenset({("POST", "/v1/audits"), ("POST", "/v1/endpoints/probe")})


def _admin(runtime: Runtime, request: Request) -> dict[str, str]:
    """Check for an admin key; the headers that carry it into the in-process calls."""
    runtime.auth.admin(request.scope)
    value = request.headers.get("authorization")
    return {"authorization": value} if value is not None else {}


async def _listing(runtime: Runtime) -> Response:
    try:
        await runtime.telemetry.flush()  # the traffic up to now, in the roll-ups
        data = await runtime.records.records()
        for record in data:
            record.routing = runtime.balancer.state(record.name)
    except StoreUnavailable as exc:
        raise ServiceUnavailable(f"record store unavailable: {exc}") from None
    return json_response(EndpointList(data=data).model_dump(mode="json"))


async def list_endpoints(runtime: Runtime, request: Request) -> Response:
    """Every endpoint's record (its traffic and routing state: admin keys only unless
    ``metrics_public``)."""
    runtime.auth.tenant(request.scope)
    runtime.traffic_viewer(request.scope)
    if "probe" in request.query_params:
        raise InvalidRequest("probes run with POST /v1/endpoints/probe", param="probe")
    return await _listing(runtime)


async def probe_endpoints(runtime: Runtime, request: Request) -> Response:
    """Probe every endpoint (admin; 409 while a probe of any of them runs), then list."""
    headers = _admin(runtime, request)
    records = runtime.records
    busy = records.busy(list(records.endpoints))
    if busy:
        raise Conflict(f"a probe of {', '.join(busy)} is running; try again when it ends")
    transport = AppTransport(request.app)
    async with httpx.AsyncClient(
        base_url=IN_PROCESS_URL, transport=transport, timeout=PROBE_TIMEOUT_S
    ) as gateway:
        try:
            await records.probe(gateway, headers, PROBE_TIMEOUT_S)
        except StoreUnavailable as exc:
            raise ServiceUnavailable(f"record store unavailable: {exc}") from None
    return await _listing(runtime)


async def _engine_memory(runtime: Runtime, name: str) -> dict[str, Any]:
    local = runtime.local.get(name)
    if local is None:
        raise NotFound(f"no in-process local endpoint {name!r}", param="name")
    engine = await local.engine()
    try:
        memory: dict[str, Any] = engine.memory()
    except Exception as exc:  # an engine bug must not become a stack trace
        raise ServiceUnavailable(f"engine memory unavailable: {type(exc).__name__}") from None
    runtime.telemetry.set_memory(name, memory)
    return memory


async def endpoint_memory(runtime: Runtime, request: Request) -> Response:
    """Memory of an in-process local endpoint's engine (weights, KV cache, indexes), bytes
    (admin keys only unless ``metrics_public``)."""
    runtime.auth.tenant(request.scope)
    runtime.traffic_viewer(request.scope)
    return json_response(await _engine_memory(runtime, request.path_params["name"]))


async def create_audit(runtime: Runtime, lock: asyncio.Lock, request: Request) -> Response:
    """Run an audit of one endpoint through this gateway (in process) and return its
    result; 409 while another audit runs (``lock``)."""
    from gateway.audit.runner import PlanError, audit_client, plan_for, run_audit

    headers = _admin(runtime, request)
    raw = await read_body(
        request.receive,
        runtime.settings.max_body_bytes,
        request.headers.get("content-length", "").encode() or None,
    )
    body = validate(AuditRequest, parse_json(raw))
    records = runtime.records
    endpoint = records.endpoints.get(body.endpoint)
    if endpoint is None:
        raise NotFound(f"no endpoint named {body.endpoint!r}", param="endpoint")
    try:
        plan = plan_for(body, kind=endpoint.kind, model=model_names(endpoint)[0])
    except PlanError as exc:
        raise InvalidRequest(str(exc), param=exc.param) from None
    plan.progress = False
    if lock.locked():
        raise Conflict("an audit is running on this gateway; one runs at a time")

    async def memory() -> dict[str, Any] | None:
        if endpoint.name not in runtime.local:
            return None
        try:
            return await _engine_memory(runtime, endpoint.name)
        except GatewayError:
            return None

    results: list[AuditResult] = []

    async def audit() -> None:
        transport = AppTransport(request.app)
        async with audit_client(f"{IN_PROCESS_URL}/v1", headers=headers, transport=transport) as c:
            results.append(await run_audit(plan, c, memory=memory))

    async with lock:
        if await run_until_disconnect(request.receive, audit):
            return Response(status_code=499)  # the client left: nobody reads this
    [result] = results
    try:
        await records.add_evidence(endpoint.name, result.summary.measured_evidence)
    except StoreUnavailable:
        result.summary.record_update = "record store unavailable: evidence not stored"
    if not body.include_records:
        result.records = []
    return json_response(result.model_dump(mode="json"))


def records_routes(runtime: Runtime) -> list[Route]:
    """The records, probe, memory and audit routes bound to ``runtime``."""
    audit_lock = asyncio.Lock()
    return [
        Route("/v1/endpoints", partial(list_endpoints, runtime), methods=["GET"]),
        Route("/v1/endpoints/probe", partial(probe_endpoints, runtime), methods=["POST"]),
        Route("/v1/endpoints/{name}/memory", partial(endpoint_memory, runtime), methods=["GET"]),
        Route("/v1/audits", partial(create_audit, runtime, audit_lock), methods=["POST"]),
    ]
