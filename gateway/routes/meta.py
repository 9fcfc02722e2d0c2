"""``GET /v1/models`` (the model names clients may send), ``GET /healthz`` and ``GET /metrics``."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.responses import json_response
from gateway.runtime import Runtime


def meta_routes(runtime: Runtime) -> list[Route]:
    """``GET /v1/models``, ``GET /healthz`` and ``GET /metrics`` bound to ``runtime``."""

    async def models(request: Request) -> Response:
        runtime.auth.tenant(request.scope)
        extras: dict[str, dict[str, Any]] = {}  # model name -> what its endpoint says it honours
        for endpoint in runtime.endpoints.values():
            said = endpoint.capabilities()
            if said:
                extras.update((name, said) for name in endpoint.config.client_names())
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "draftgate"}
            | ({"draftgate": extras[name]} if name in extras else {})
            for name in runtime.model_names()
        ]
        return json_response({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        local = {name: endpoint.state for name, endpoint in runtime.local.items()}
        endpoints = [e.name for e in runtime.settings.endpoints]
        return json_response({"status": "ok", "endpoints": endpoints, "local": local})

    async def metrics(request: Request) -> Response:
        runtime.traffic_viewer(request.scope)
        return Response(
            runtime.telemetry.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
