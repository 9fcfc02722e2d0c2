"""``GET /v1/endpoints`` (speculation records), ``GET /v1/endpoints/{name}/memory`` (a local
endpoint's memory) and ``POST /v1/audits`` (run an audit through this gateway)."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.http.asgi import read_body
from gateway.http.responses import json_response
from gateway.http.validation import parse_json, validate
from gateway.records.service import model_names
from gateway.runtime import Runtime
from lookup.corpus.errors import StoreUnavailable
from sdk.wire.endpoints import AuditRequest, EndpointList, Evidence


def _authorize(runtime: Runtime, request: Request) -> dict[str, str]:
    """Check the caller's gateway key; the headers to reuse for calls back into the gateway."""
    runtime.auth.tenant(request.scope)
    value = request.headers.get("authorization")
    return {"authorization": value} if value is not None else {}


def _gateway_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def list_endpoints(runtime: Runtime, request: Request) -> Response:
    """Every endpoint's record; ``?probe=1`` runs the probes first."""
    headers = _authorize(runtime, request)
    records = runtime.records
    try:
        if request.query_params.get("probe", "").lower() in ("1", "true", "yes"):
            await records.probe(_gateway_url(request), headers)
        await runtime.telemetry.flush()  # the traffic up to now, in the roll-ups
        data = await records.records()
    except StoreUnavailable as exc:
        raise ServiceUnavailable(f"record store unavailable: {exc}") from None
    return json_response(EndpointList(data=data).model_dump(mode="json"))


async def endpoint_memory(runtime: Runtime, request: Request) -> Response:
    """Memory of an in-process local endpoint's engine (weights, KV cache, indexes), bytes."""
    _authorize(runtime, request)
    name = request.path_params["name"]
    local = runtime.local.get(name)
    if local is None:
        raise NotFound(f"no in-process local endpoint {name!r}", param="name")
    engine = await local.engine()
    try:
        memory = engine.memory()
    except Exception as exc:  # an engine bug must not become a stack trace
        raise ServiceUnavailable(f"engine memory unavailable: {type(exc).__name__}") from None
    runtime.telemetry.set_memory(name, memory)
    return json_response(memory)


async def create_audit(runtime: Runtime, request: Request) -> Response:
    """Run an audit of one endpoint through this gateway and return its result."""
    from gateway.audit.runner import AuditPlan, run_audit
    from gateway.audit.workload import load_workload, parse_item

    headers = _authorize(runtime, request)
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
        items = [parse_item(raw) for raw in body.workload] if body.workload else load_workload()
    except ValueError as exc:
        raise InvalidRequest(f"workload: {exc}", param="workload") from None
    sweep = next(iter(body.sweep.items())) if body.sweep else None
    if len(body.sweep) > 1:
        raise InvalidRequest("sweep: vary one setting at a time", param="sweep")
    plan = AuditPlan(
        base_url=_gateway_url(request),
        endpoint=endpoint.name,
        model=model_names(endpoint)[0],
        items=items,
        kind=endpoint.kind,
        concurrency=body.concurrency,
        requests=body.requests,
        poisson_rate=body.poisson_rate,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        sweep=sweep,
        headers=headers,
        progress=False,
    )
    try:
        plan.settings()
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="sweep") from None
    result = await run_audit(plan)
    try:
        await records.add_evidence(
            endpoint.name, Evidence.model_validate(result.summary["measured_evidence"])
        )
    except StoreUnavailable:
        result.summary["record_update"] = "record store unavailable: evidence not stored"
    if not body.include_records:
        result.records = []
    return json_response(result.model_dump(mode="json"))


def records_routes(runtime: Runtime) -> list[Route]:
    """The records, memory and audit routes bound to ``runtime``."""
    return [
        Route("/v1/endpoints", partial(list_endpoints, runtime), methods=["GET"]),
        Route("/v1/endpoints/{name}/memory", partial(endpoint_memory, runtime), methods=["GET"]),
        Route("/v1/audits", partial(create_audit, runtime), methods=["POST"]),
    ]
