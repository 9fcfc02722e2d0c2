"""``/ui``: the dashboard's pages and the JSON its script polls.

Pages: the overview (live traffic per endpoint), the endpoints (records, routing, local
engines), the tenants (admin), one tenant's page (its admin or itself) and the audits
(admin: start one, watch it, its figures and plots). Every page
needs a viewer (:mod:`gateway.ui.session`); one without is sent to the sign-in page.
Traffic figures follow the API's rule (:meth:`Runtime.traffic_viewer`): admin keys,
unless ``metrics_public``. Pages answer errors as a page, the JSON routes as JSON.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from gateway.audit.runner import MemoryReader
from gateway.audit.workload import load_workload
from gateway.auth import DEFAULT_TENANT
from gateway.endpoints.local.endpoint import LocalEndpoint
from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)
from gateway.http import guard
from gateway.http.asgi import read_body
from gateway.http.responses import error_response, json_response
from gateway.http.validation import parse_json, validate
from gateway.limit_windows import ClientWindows
from gateway.runtime import Runtime
from gateway.ui import svg
from gateway.ui.audit_view import report_html
from gateway.ui.audits import Audits
from gateway.ui.session import COOKIE, SESSION_S, Sessions, Viewer, same_origin
from lookup.corpus.errors import StoreUnavailable
from sdk.wire.endpoints import AuditRequest

SPAN_S = 60.0  # the overview's figures: the last minute
CHART_S = 300.0  # its charts: the last five minutes
CHART_BUCKETS = 30
MAX_KEY_CHARS = 4096

PATHS = frozenset(
    {
        "/ui",
        "/ui/",
        "/ui/overview.json",
        "/ui/endpoints",
        "/ui/tenants",
        "/ui/tenant",
        "/ui/login",
        "/ui/logout",
        "/ui/audits",
        "/ui/audit",
        "/ui/audit.json",
        "/ui/audit/plot",
        "/ui/static/ui.js",
        "/ui/static/ui.css",
    }
)
"""Every dashboard path: served before the API's key check and not counted toward a
tenant's limits (the dashboard checks its viewer itself)."""

_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
_SVG_HEADERS = {  # matplotlib's SVG styles its shapes; it is shown as an image, never run
    **_HEADERS,
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
}
_STATIC = {"ui.js": "text/javascript", "ui.css": "text/css"}

_templates = Environment(
    loader=PackageLoader("gateway.ui", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)

Handler = Callable[[Request, Viewer], Awaitable[Response]]


def _engine(local: LocalEndpoint) -> dict[str, Any]:
    """A local endpoint's engine as the endpoints page shows it (its typed snapshot)."""
    try:
        stats = local.stats()
    except Exception as exc:  # an engine bug must not take the page down
        return {"state": f"unavailable ({type(exc).__name__})", "stats": None}
    if stats is None:
        return {"state": local.state, "stats": None}
    share = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else None
    return {
        "state": local.state,
        "stats": stats,
        "kv_bar": svg.share_bar(share, title=f"{share or 0:.0%} of the KV pool's blocks in use"),
    }


def _own_page(viewer: Viewer) -> str:
    return f"/ui/tenant?name={quote(viewer.tenant)}"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


class Dashboard:
    """The dashboard bound to one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.sessions = Sessions(runtime.auth)
        self.audits = Audits(runtime.records, runtime.settings.audit_dir)
        self._wrong_keys = ClientWindows(time.monotonic)
        self.categories = sorted({item.category for item in load_workload()})

    # -- rendering and access -------------------------------------------------------

    def render(
        self, request: Request, name: str, viewer: Viewer | None, status: int = 200, **values: Any
    ) -> HTMLResponse:
        html = _templates.get_template(name).render(
            viewer=viewer,
            sign_in=self.sessions.needed,
            traffic=viewer is not None and self._sees_traffic(viewer),
            path=request.url.path,
            **values,
        )
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    def _sees_traffic(self, viewer: Viewer) -> bool:
        return viewer.admin or self.runtime.settings.metrics_public

    def _traffic(self, viewer: Viewer) -> None:
        if not self._sees_traffic(viewer):
            raise PermissionDenied("the traffic of every tenant needs an admin key")

    def page(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` as a page: a request without a viewer goes to the sign-in page, an
        error becomes an error page with its status."""

        async def endpoint(request: Request) -> Response:
            viewer: Viewer | None = None
            try:
                viewer = self.sessions.viewer(request)
                if viewer is None:
                    return RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
                return await handler(request, viewer)
            except GatewayError as error:
                return self.render(request, "error.html", viewer, error.status, error=error.message)

        return endpoint

    def data(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` as a JSON route: 401 without a viewer; errors as the API's JSON."""

        async def endpoint(request: Request) -> Response:
            try:
                viewer = self.sessions.viewer(request)
                if viewer is None:
                    raise AuthenticationFailed("sign in at /ui/login or send a gateway key")
                return await handler(request, viewer)
            except GatewayError as error:
                return error_response(error)

        return endpoint

    # -- pages ----------------------------------------------------------------------

    async def overview(self, request: Request, viewer: Viewer) -> Response:
        if not self._sees_traffic(viewer):  # a tenant key: its own page
            return RedirectResponse(_own_page(viewer), status_code=303)
        return self.render(request, "overview.html", viewer, live=self._live(), span_s=SPAN_S)

    async def overview_json(self, request: Request, viewer: Viewer) -> Response:
        self._traffic(viewer)
        return json_response(self._live())

    def _live(self) -> dict[str, Any]:
        window = self.runtime.telemetry.recent
        names = [e.name for e in self.runtime.settings.endpoints]
        names += [n for n in window.endpoints() if n not in names]
        rows = []
        requests: dict[str, list[float]] = {}
        tokens: dict[str, list[float]] = {}
        width = CHART_S / CHART_BUCKETS
        for name in names:
            f = window.figures(name, SPAN_S)
            rows.append(
                {
                    "endpoint": name,
                    "requests": f.requests,
                    "errors": f.errors,
                    "requests_per_s": round(f.requests_per_s, 3),
                    "ttft_p50_ms": _ms(f.ttft_p50),
                    "ttft_p99_ms": _ms(f.ttft_p99),
                    "tpot_p50_ms": _ms(f.tpot_p50),
                    "tpot_p99_ms": _ms(f.tpot_p99),
                    "output_tokens_per_s": round(f.output_tokens_per_s, 2),
                    "drafted_share": None if f.drafted_share is None else round(f.drafted_share, 4),
                    "drafted_bar": svg.share_bar(f.drafted_share),
                }
            )
            series = window.series(name, CHART_S, CHART_BUCKETS)
            if any(r for r, _ in series):
                requests[name] = [r / width for r, _ in series]
                tokens[name] = [t / width for _, t in series]
        return {
            "span_s": SPAN_S,
            "generated_at": time.time(),
            "endpoints": rows,
            "charts": {
                "requests": svg.line_chart(
                    requests, title="requests/s, last 5 minutes (10 s buckets)"
                ),
                "tokens": svg.line_chart(
                    tokens, title="output tokens/s, last 5 minutes (10 s buckets)"
                ),
            },
        }

    async def endpoints(self, request: Request, viewer: Viewer) -> Response:
        self._traffic(viewer)
        runtime = self.runtime
        try:
            await runtime.telemetry.flush()
            records = await runtime.records.records()
        except StoreUnavailable as exc:
            raise ServiceUnavailable(f"record store unavailable: {exc}") from None
        for record in records:
            record.routing = runtime.balancer.state(record.name)
        engines = {name: _engine(local) for name, local in runtime.local.items()}
        return self.render(
            request,
            "endpoints.html",
            viewer,
            records=[r.model_dump(mode="json") for r in records],
            engines=engines,
        )

    def _tenants(self) -> list[str]:
        names = [key.tenant for key in self.runtime.settings.keys]
        return list(dict.fromkeys(names)) or [DEFAULT_TENANT]

    async def tenants(self, request: Request, viewer: Viewer) -> Response:
        if not viewer.admin:
            raise PermissionDenied("the list of tenants needs an admin key")
        rows = [await self._tenant(name) for name in self._tenants()]
        return self.render(request, "tenants.html", viewer, tenants=rows)

    async def tenant(self, request: Request, viewer: Viewer) -> Response:
        name = request.query_params.get("name", viewer.tenant)
        if not viewer.may_see(name):
            raise PermissionDenied("a tenant key sees its own tenant's page only")
        if name not in self._tenants():
            raise NotFound(f"no tenant named {name!r}")
        return self.render(request, "tenant.html", viewer, tenant=await self._tenant(name))

    async def _tenant(self, name: str) -> dict[str, Any]:
        settings = self.runtime.settings
        weight = next((k.weight for k in settings.keys if k.tenant == name), 1.0)
        try:
            documents = await self.runtime.corpus.list(name)
        except (StoreUnavailable, GatewayError, ValueError) as exc:
            return {"name": name, "weight": weight, "documents": None, "error": str(exc)}
        return {
            "name": name,
            "weight": weight,
            "limits": settings.limits.model_dump(),
            "documents": len(documents),
            "bytes": sum(d.bytes for d in documents),
            "recent": [
                {"id": d.id, "path": d.path, "bytes": d.bytes, "last_used": d.last_used}
                for d in documents[:20]
            ],
            "error": None,
        }

    # -- audits ---------------------------------------------------------------------

    @staticmethod
    def _admin(viewer: Viewer) -> None:
        if not viewer.admin:
            raise PermissionDenied("audits need an admin key")

    async def audits_page(self, request: Request, viewer: Viewer) -> Response:
        self._admin(viewer)
        return self.render(
            request,
            "audits.html",
            viewer,
            runs=self.audits.runs(),
            audit_dir=self.runtime.settings.audit_dir,
            endpoints=list(self.runtime.records.endpoints),
            categories=self.categories,
        )

    async def start_audit(self, request: Request, viewer: Viewer) -> Response:
        """``{"endpoint", "categories", "concurrency", "requests", "key"}`` -> the run's id
        (posted by the audits page's script; ``key``: an admin key, when keys are set)."""
        if not same_origin(request):
            raise PermissionDenied("an audit must be started from this gateway's own page")
        self._admin(viewer)
        data = parse_json(await self._body(request))
        if not isinstance(data, dict):
            raise InvalidRequest("send a JSON object")
        headers: dict[str, str] = {}
        if self.sessions.needed:  # the audit's own requests carry an admin key
            key = data.pop("key", None)
            if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
                raise InvalidRequest("an audit needs an admin key", param="key")
            if not self.sessions.key_viewer(key).admin:
                raise PermissionDenied("audits need an admin key")
            headers = {"authorization": f"Bearer {key}"}
        categories = data.pop("categories", [])
        if not isinstance(categories, list) or not all(c in self.categories for c in categories):
            raise InvalidRequest(
                f"categories: a list of {', '.join(self.categories)}", param="categories"
            )
        body = validate(AuditRequest, data)
        run = self.audits.start(request.app, body, categories, headers, self._memory(body.endpoint))
        return json_response({"id": run.id, "next": f"/ui/audit?id={run.id}"}, status=202)

    def _memory(self, endpoint: str) -> MemoryReader:
        """Reads a local endpoint's engine memory at an audit's end (as ``draftgate
        audit`` reads ``/v1/endpoints/{name}/memory``); None for other endpoints."""
        local = self.runtime.local.get(endpoint)

        async def read() -> dict[str, Any] | None:
            stats = None if local is None else local.stats()
            return None if stats is None else dict(stats.memory)

        return read

    async def audit_page(self, request: Request, viewer: Viewer) -> Response:
        self._admin(viewer)
        run = self.audits.get(request.query_params.get("id", ""))
        plots = await self.audits.plots(run)
        return self.render(
            request,
            "audit.html",
            viewer,
            run=run,
            headline=run.headline(),
            report=None if run.result is None else report_html(run.result),
            plots=list(plots),
        )

    async def audit_json(self, request: Request, viewer: Viewer) -> Response:
        self._admin(viewer)
        return json_response(self.audits.get(request.query_params.get("id", "")).status())

    async def audit_plot(self, request: Request, viewer: Viewer) -> Response:
        self._admin(viewer)
        run = self.audits.get(request.query_params.get("id", ""))
        plot = (await self.audits.plots(run)).get(request.query_params.get("name", ""))
        if plot is None:
            raise NotFound("no such plot", param="name")
        return Response(plot, media_type="image/svg+xml", headers=_SVG_HEADERS)

    # -- sign-in --------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        return self.render(request, "login.html", None)

    async def login(self, request: Request) -> Response:
        """``{"key": ...}`` -> a session cookie (JSON; posted by the sign-in page's script)."""
        try:
            if not same_origin(request):
                raise PermissionDenied("sign-in must come from this gateway's own page")
            data = parse_json(await self._body(request))
            key = data.get("key") if isinstance(data, dict) else None
            if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
                raise InvalidRequest('send {"key": "<gateway key>"}', param="key")
            if not self.sessions.needed:
                return json_response({"tenant": DEFAULT_TENANT, "next": "/ui/"})
            try:
                token, viewer = self.sessions.sign_in(key)
            except AuthenticationFailed as failed:  # counted per address, as the API's door
                raise self._failed_sign_in(request) or failed from None
        except GatewayError as error:
            return error_response(error)
        nxt = "/ui/" if self._sees_traffic(viewer) else _own_page(viewer)
        response = json_response({"tenant": viewer.tenant, "next": nxt})
        response.set_cookie(
            COOKIE,
            token,
            max_age=int(SESSION_S),
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    def _failed_sign_in(self, request: Request) -> RateLimited | None:
        """A 429 once an address sent ``unauthenticated_per_minute`` wrong keys in a minute."""
        per_minute = self.runtime.settings.limits.unauthenticated_per_minute
        wait = self._wrong_keys.count(guard.client_address(request.scope), per_minute)
        if wait is None:
            return None
        retry = str(max(1, math.ceil(wait)))
        return RateLimited(
            f"too many wrong keys from this address; retry after {retry} s",
            headers={"retry-after": retry},
        )

    async def logout(self, request: Request) -> Response:
        if not same_origin(request):
            return error_response(PermissionDenied("sign-out must come from this gateway's page"))
        self.sessions.sign_out(request.cookies.get(COOKIE))
        response = json_response({"next": "/ui/login"})
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    async def _body(self, request: Request) -> bytes:
        return await read_body(
            request.receive,
            min(self.runtime.settings.max_body_bytes, 64 * 1024),
            request.headers.get("content-length", "").encode() or None,
        )

    async def static(self, request: Request) -> Response:
        name = request.url.path.rsplit("/", 1)[1]
        body = resources.files("gateway.ui").joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers=_HEADERS)


def ui_routes(runtime: Runtime) -> list[BaseRoute]:
    """The dashboard bound to ``runtime``: one mount (its pages are no part of the API's
    description; ``/ui`` is redirected to ``/ui/``)."""
    ui = Dashboard(runtime)
    routes = [
        Route("/", ui.page(ui.overview), methods=["GET"]),
        Route("/overview.json", ui.data(ui.overview_json), methods=["GET"]),
        Route("/endpoints", ui.page(ui.endpoints), methods=["GET"]),
        Route("/tenants", ui.page(ui.tenants), methods=["GET"]),
        Route("/tenant", ui.page(ui.tenant), methods=["GET"]),
        Route("/audits", ui.page(ui.audits_page), methods=["GET"]),
        Route("/audits", ui.data(ui.start_audit), methods=["POST"]),
        Route("/audit", ui.page(ui.audit_page), methods=["GET"]),
        Route("/audit.json", ui.data(ui.audit_json), methods=["GET"]),
        Route("/audit/plot", ui.data(ui.audit_plot), methods=["GET"]),
        Route("/login", ui.login_page, methods=["GET"]),
        Route("/login", ui.login, methods=["POST"]),
        Route("/logout", ui.logout, methods=["POST"]),
        *(Route(f"/static/{name}", ui.static, methods=["GET"]) for name in _STATIC),
    ]
    return [Mount("/ui", routes=routes)]
