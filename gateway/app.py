"""The ASGI application: ``create_app(settings) -> Starlette``.

Routes: one ``POST`` route per front door (:data:`FRONT_DOORS`: ``/v1/chat/completions``,
``/v1/completions``, ...; pure ASGI, the hot path, dispatched before Starlette's router
and middleware stack), ``GET /v1/models``,
``GET /healthz``, ``GET /metrics``, ``/v1/documents``, the records/audits routes and
``GET /openapi.json``.
Every response carries ``X-Draftgate-Overhead-Ms``.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.apis.anthropic.count_tokens import CountTokens
from gateway.apis.anthropic.door import MessagesDoor
from gateway.apis.responses.door import open_door
from gateway.apis.responses.routes import response_routes
from gateway.config import Settings, load_settings
from gateway.errors import GatewayError, NotFound
from gateway.front_door import CHAT, COMPLETIONS, FrontDoor
from gateway.http import guard
from gateway.http.asgi import ClientDisconnected, overhead_middleware, send_error
from gateway.http.responses import error_response
from gateway.http.tarpit import Tarpit
from gateway.limits import tenant_limits
from gateway.routes.completions import CompletionsRoute, send_door_error
from gateway.routes.documents import document_routes
from gateway.routes.meta import meta_routes
from gateway.routes.openapi import openapi_routes
from gateway.routes.records import ADMIN_ROUTES, records_routes
from gateway.routing.health import Clock
from gateway.runtime import Runtime
from gateway.telemetry import Telemetry
from gateway.ui import PATHS as UI_PATHS
from gateway.ui import ui_routes
from lookup.corpus import Corpus

# path -> the front door answering POSTs to it: a new client-facing API is one line here
FRONT_DOORS: dict[str, FrontDoor] = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETIONS,
}

UNCOUNTED_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json"})
"""Served to anyone, never counted toward a limit (probes and the API's description)."""


class _MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class _Gateway(Starlette):
    """Starlette, with ``POST`` to the front doors' paths sent straight to their routes
    (each behind the overhead middleware, catching as the stack would): routing and the
    middleware stack cost tens of microseconds per request. Everything else, other
    methods on these paths included, goes through Starlette."""

    def __init__(
        self,
        fast: dict[str, ASGIApp],
        *,
        door: guard.Door,
        tarpit: Tarpit,
        doors: Mapping[str, FrontDoor],
        loopback_only: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._fast = {path: overhead_middleware(app, catch=True) for path, app in fast.items()}
        self._door = door
        self.tarpit = tarpit
        self._doors = doors
        self._loopback_only = loopback_only
        self._refuse = overhead_middleware(self._send_refusal)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._door.check(scope) or guard.check(
                scope, loopback_only=self._loopback_only
            )
            if refusal is not None:
                answer = await self.tarpit.hold(refusal, receive, send)
                if answer is not None:  # None: the client hung up while its refusal was held
                    scope["draftgate.refusal"] = refusal
                    await self._refuse(scope, receive, answer)
                return
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            app = self._fast.get(scope["path"])
            if app is not None:
                scope["app"] = self
                await app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def door_of(self, path: str) -> FrontDoor | None:
        """The front door whose API ``path`` belongs to (its own path or one below it)."""
        return next((d for p, d in self._doors.items() if path.startswith(p)), None)

    async def _send_refusal(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The refusal in the shape of the API its path belongs to (OpenAI's by default)."""
        door = self.door_of(scope["path"])
        if door is None:
            await send_error(send, scope["draftgate.refusal"])
        else:
            await send_door_error(send, door, scope["draftgate.refusal"])


def _error_response(request: Request, error: GatewayError) -> Response:
    """``error`` in the shape of the API the request's path belongs to (OpenAI's by default)."""
    door = request.app.door_of(request.url.path) if isinstance(request.app, _Gateway) else None
    if door is None:
        return error_response(error)
    return Response(
        door.error_body(error),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _error_response(request, NotFound(f"no route {request.method} {request.url.path}"))
    if exc.status_code == 405:
        return _error_response(
            request,
            _MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}"),
        )
    error = GatewayError(str(exc.detail))
    error.status = exc.status_code
    return _error_response(request, error)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return _error_response(request, exc)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """Nobody reads this answer: the client left while sending its body."""
    return Response(status_code=499)


async def _server_error(request: Request, exc: Exception) -> Response:
    return _error_response(request, GatewayError("internal gateway error"))


def create_app(
    settings: Settings | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    telemetry: Telemetry | None = None,
    corpus: Corpus | None = None,
    engines: Mapping[str, Any] | None = None,
    clock: Clock = time.monotonic,
) -> Starlette:
    """The gateway app for ``settings`` (default: ``load_settings()``).

    ``environ`` supplies API keys (default ``os.environ``); ``transport`` replaces the
    network transport of every HTTP upstream (tests); ``telemetry``/``corpus`` replace
    the defaults built from the settings; ``engines`` maps local endpoint names to
    already loaded ``local_verifier`` engines (shared by tests); ``clock`` (monotonic
    seconds) times the endpoints' ejection back-offs.
    """
    runtime = Runtime(
        settings or load_settings(),
        environ=environ,
        transport=transport,
        telemetry=telemetry,
        corpus=corpus,
        engines=engines,
        clock=clock,
    )

    responses = open_door(runtime.settings)  # its stored responses: per app, as the corpus

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.start()
        # start-up objects (modules, settings, routes) leave the collector's scans: a full
        # pass over them stalls every request in flight for tens of milliseconds
        gc.freeze()
        try:
            yield
        finally:
            await runtime.aclose()
            await runtime.telemetry.aclose()
            await responses.store.aclose()

    doors: dict[str, FrontDoor] = {
        **FRONT_DOORS,
        "/v1/messages": MessagesDoor(runtime.routes),
        "/v1/responses": responses,
    }
    completions: dict[str, ASGIApp] = {
        path: CompletionsRoute(runtime, door) for path, door in doors.items()
    }
    routes: list[BaseRoute] = [
        *(Route(path, app, methods=["POST"]) for path, app in completions.items()),
        *meta_routes(runtime),
        Route("/v1/messages/count_tokens", CountTokens(runtime), methods=["POST"]),
        *document_routes(runtime),
        *response_routes(runtime, responses),
        *records_routes(runtime),
        *openapi_routes(),
        *ui_routes(runtime),
    ]
    door = guard.Door(
        runtime.auth,
        runtime.limiter,
        exempt=UNCOUNTED_PATHS | UI_PATHS,
        per_minute=runtime.settings.limits.unauthenticated_per_minute,
        count=runtime.telemetry.count_refusal,
    )
    limits = runtime.settings.limits
    app = _Gateway(
        completions,
        door=door,
        tarpit=Tarpit(limits.over_limit_hold_s, limits.over_limit_max_held),
        doors=doors,
        loopback_only=not runtime.auth.enabled and not runtime.settings.allow_public_bind,
        routes=routes,
        middleware=[
            Middleware(overhead_middleware),
            Middleware(
                tenant_limits,
                auth=runtime.auth,
                limiter=runtime.limiter,
                exempt=UNCOUNTED_PATHS | UI_PATHS,
                admin_only=ADMIN_ROUTES,
            ),
        ],
        exception_handlers={
            HTTPException: _http_error,
            GatewayError: _gateway_error,
            ClientDisconnected: _client_gone,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    return app
