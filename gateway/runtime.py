"""Everything a running gateway holds: settings, auth, routes, the endpoints (one mapping,
every kind), the document corpus, telemetry, the speculation records and the balancer.
Built by ``create_app``; started and closed by the app's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.types import Scope

from gateway.auth import Authenticator
from gateway.call import Call
from gateway.config import EndpointConfig, Settings
from gateway.endpoints.endpoint import Endpoint
from gateway.endpoints.hosted.endpoint import HostedEndpoint
from gateway.endpoints.hosted.upstream import Upstream
from gateway.endpoints.in_engine import InEngineEndpoint
from gateway.endpoints.local.endpoint import LocalEndpoint
from gateway.endpoints.remote.endpoint import RemoteEndpoint
from gateway.endpoints.remote.selftest import SelfTest
from gateway.endpoints.verifying import VerifyingEndpoint
from gateway.limits import open_limiter
from gateway.provider_table import PROVIDERS
from gateway.records.evidence import make
from gateway.records.service import Records
from gateway.records.store import open_record_store
from gateway.routing.balancer import Balancer
from gateway.routing.checks import HealthChecks
from gateway.routing.health import Clock
from gateway.routing.replica_collector import ReplicaCollector
from gateway.telemetry import Telemetry
from lookup.corpus import Corpus, open_store

log = logging.getLogger(__name__)


class Runtime:
    """The gateway's long-lived state (one per app)."""

    def __init__(
        self,
        settings: Settings,
        *,
        environ: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        telemetry: Telemetry | None = None,
        corpus: Corpus | None = None,
        engines: Mapping[str, Any] | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.settings = settings
        self.auth = Authenticator.from_settings(settings, env)
        self.routes = settings.routes()
        self.corpus = corpus or Corpus(
            open_store(
                settings.redis.url, prefix=settings.redis.prefix, timeout_s=settings.redis.timeout_s
            ),
            ttl_s=settings.documents.ttl_s,
            select_max_ids=settings.documents.max_ids,
        )
        self.telemetry = telemetry or Telemetry(
            open_record_store(settings.redis.url, prefix=settings.redis.prefix)
        )
        self.limiter = open_limiter(
            settings.limits,
            settings.redis.url,
            prefix=settings.redis.prefix,
            timeout_s=settings.redis.timeout_s,
        )
        self.records = Records(settings.endpoints, self.telemetry.store)
        self.endpoints: dict[str, Endpoint] = {
            e.name: self._endpoint(e, env, transport, engines or {}) for e in settings.endpoints
        }
        self.balancer = Balancer(
            settings.routing,
            settings.endpoints,
            clock,
            ordered_models=frozenset(settings.fallback),
        )
        self.health_checks = HealthChecks(self.balancer, self.upstreams)
        self.telemetry.registry.register(ReplicaCollector(self.balancer))
        for name, local in self.local.items():
            self.telemetry.watch_engine(name, local.stats)
        self._checking: asyncio.Task[None] | None = None

    def _endpoint(
        self,
        config: EndpointConfig,
        env: Mapping[str, str],
        transport: httpx.AsyncBaseTransport | None,
        engines: Mapping[str, Any],
    ) -> Endpoint:
        """The endpoint object serving ``config``."""
        settings = self.settings
        if PROVIDERS[config.kind].in_process and config.base_url is None:
            return LocalEndpoint(
                config,
                self.corpus,
                recent=settings.documents.recent,
                engine=engines.get(config.name),
                weights={key.tenant: key.weight for key in settings.keys},
            )
        if config.verify == "in-engine":
            return InEngineEndpoint(
                config,
                env,
                self.corpus,
                recent=settings.documents.recent,
                transport=transport,
                max_response_bytes=settings.max_response_bytes,
                capture=settings.capture,
            )
        relay = HostedEndpoint(
            config,
            env,
            self.corpus,
            transport=transport,
            max_response_bytes=settings.max_response_bytes,
            capture=settings.capture,
        )
        if config.verify == "off":
            return relay
        remote = RemoteEndpoint(config, self.corpus, env, recent=settings.documents.recent)
        return VerifyingEndpoint(remote, relay, self._remote_self_test)

    @property
    def local(self) -> dict[str, LocalEndpoint]:
        """The in-process endpoints (a view of :attr:`endpoints`)."""
        return {n: e for n, e in self.endpoints.items() if isinstance(e, LocalEndpoint)}

    @property
    def upstreams(self) -> dict[str, Upstream]:
        """The HTTP upstreams of the endpoints reached over HTTP (a view of :attr:`endpoints`)."""
        found = {}
        for name, endpoint in self.endpoints.items():
            if isinstance(endpoint, VerifyingEndpoint):
                endpoint = endpoint.relay
            if isinstance(endpoint, HostedEndpoint):
                found[name] = endpoint.upstream
        return found

    @property
    def remote(self) -> dict[str, RemoteEndpoint]:
        """The remote verifiers of ``verify`` endpoints (a view of :attr:`endpoints`)."""
        return {n: e.remote for n, e in self.endpoints.items() if isinstance(e, VerifyingEndpoint)}

    def model_names(self) -> list[str]:
        """Every model name clients may send, in configuration order."""
        return list(self.routes)

    async def start(self) -> None:
        """Start loading local models (queued first on their worker threads)."""
        for endpoint in self.endpoints.values():
            endpoint.start()
        interval = self.settings.routing.health_check_interval_s
        if interval > 0 and self.health_checks.upstreams:
            self._checking = asyncio.create_task(
                self.health_checks.run(interval), name="draftgate-health-checks"
            )

    def traffic_viewer(self, scope: Scope) -> None:
        """Check that a request may see traffic figures (every tenant's requests, routing
        state, engine memory): an admin key, unless ``metrics_public`` (or no keys)."""
        if self.settings.metrics_public:
            return
        self.auth.admin(scope)

    async def aclose(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checking
        for endpoint in self.endpoints.values():
            await endpoint.aclose()
        await self.corpus.aclose()
        await self.limiter.aclose()

    async def _remote_self_test(self, endpoint: str, result: SelfTest) -> None:
        """A remote-verify self-test's outcome, as the endpoint's record evidence."""
        await self.records.add_evidence(
            endpoint,
            make(
                "measured",
                "remote verify self-test",
                "yes" if result.state == "exact" else "no",
                result.detail,
                result.values(),
                feature="remote_verify",
            ),
        )

    async def capture(self, call: Call) -> None:
        """Store the answer and the request's code blocks in the tenant's namespace after
        the response (the corpus does it in the background, bounded; it never raises)."""
        await self.corpus.capture(
            call.tenant, call.response_text, request_texts=[call.prompt_text()]
        )
