"""The ASGI application: ``create_app(settings) -> Starlette``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (pure ASGI, the hot
path), ``GET /v1/models``, ``GET /healthz``, ``GET /metrics``, ``/v1/documents``, and the
records/audits routes. Every response carries ``X-Draftgate-Overhead-Ms``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.asgi import overhead_middleware
from gateway.config import Settings, load_settings
from gateway.errors import GatewayError, NotFound
from gateway.proxy import CompletionsEndpoint
from gateway.routes_documents import document_routes, error_response, json_response
from gateway.routes_records import routes as records_routes
from gateway.runtime import Runtime
from gateway.telemetry import Telemetry
from lookup.corpus import Corpus


class _MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


def _meta_routes(runtime: Runtime) -> list[Route]:
    async def models(request: Request) -> Response:
        runtime.auth.tenant(_authorization(request))
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "draftgate"}
            for name in runtime.model_names()
        ]
        return json_response({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        local = {name: endpoint.state for name, endpoint in runtime.local.items()}
        endpoints = [e.name for e in runtime.settings.endpoints]
        return json_response({"status": "ok", "endpoints": endpoints, "local": local})

    async def metrics(request: Request) -> Response:
        return Response(
            runtime.telemetry.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def _authorization(request: Request) -> bytes | None:
    value = request.headers.get("authorization")
    return value.encode("latin-1") if value is not None else None


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route {request.method} {request.url.path}"))
    if exc.status_code == 405:
        return error_response(
            _MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
        )
    error = GatewayError(str(exc.detail))
    error.status = exc.status_code
    return error_response(error)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _server_error(request: Request, exc: Exception) -> Response:
    return error_response(GatewayError("internal gateway error"))


def create_app(
    settings: Settings | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    telemetry: Telemetry | None = None,
    corpus: Corpus | None = None,
    engines: Mapping[str, Any] | None = None,
) -> Starlette:
    """The gateway app for ``settings`` (default: ``load_settings()``).

    ``environ`` supplies API keys (default ``os.environ``); ``transport`` replaces the
    network transport of every HTTP upstream (tests); ``telemetry``/``corpus`` replace
    the defaults built from the settings; ``engines`` maps local endpoint names to
    already loaded ``local_verifier`` engines (shared by tests).
    """
    runtime = Runtime(
        settings or load_settings(),
        environ=environ,
        transport=transport,
        telemetry=telemetry,
        corpus=corpus,
        engines=engines,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.aclose()
            await runtime.telemetry.aclose()

    routes: list[Route] = [
        Route("/v1/chat/completions", CompletionsEndpoint(runtime, "chat"), methods=["POST"]),
        Route("/v1/completions", CompletionsEndpoint(runtime, "completions"), methods=["POST"]),
        *_meta_routes(runtime),
        *document_routes(runtime),
        *records_routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(overhead_middleware)],
        exception_handlers={
            HTTPException: _http_error,
            GatewayError: _gateway_error,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.settings = runtime.settings
    app.state.telemetry = runtime.telemetry
    app.state.corpus = runtime.corpus
    return app
