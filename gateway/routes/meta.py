"""``GET /v1/models`` (the model names clients may send), ``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config import EndpointConfig
from gateway.endpoints.local.request import capabilities as local_capabilities
from gateway.http.responses import json_response
from gateway.runtime import Runtime


def _local_entry(endpoint: EndpointConfig) -> dict[str, Any]:
    """A local model's ``/v1/models`` extras: what it honours and its answer length bounds."""
    return local_capabilities() | {
        "max_tokens_default": endpoint.answer_tokens(None),
        "max_tokens_cap": endpoint.max_tokens_cap,
    }


def meta_routes(runtime: Runtime) -> list[Route]:
    """``GET /v1/models``, ``GET /healthz`` and ``GET /metrics`` bound to ``runtime``."""

    async def models(request: Request) -> Response:
        runtime.auth.tenant(request.scope)
        local = {
            n: e for e in runtime.settings.endpoints if e.kind == "local" for n in e.client_names()
        }
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "draftgate"}
            | ({"draftgate": _local_entry(local[name])} if name in local else {})
            for name in runtime.model_names()
        ]
        return json_response({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        local = {name: endpoint.state for name, endpoint in runtime.local.items()}
        endpoints = [e.name for e in runtime.settings.endpoints]
        return json_response({"status": "ok", "endpoints": endpoints, "local": local})

    async def metrics(request: Request) -> Response:
        runtime.traffic_viewer(request.scope)
        for name, local in runtime.local.items():  # local endpoints' KV pool gauges, fresh
            memory = local.memory()
            if memory is not None:
                runtime.telemetry.set_memory(name, memory)
                runtime.telemetry.set_preemptions(name, local.preemptions())
        return Response(
            runtime.telemetry.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
