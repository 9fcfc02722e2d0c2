"""Active health checks: ``GET {base_url}/models`` on every checked endpoint, each round
feeding the endpoints' :class:`~gateway.routing.health.Health`: a pass re-admits an
ejected or half-open endpoint at once (and leaves a healthy one's failure count alone); a
failure counts like a failed request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from gateway.endpoints.hosted.upstream import Upstream
from gateway.routing.balancer import Balancer

log = logging.getLogger(__name__)


class HealthChecks:
    """The periodic checker (``run_once`` is the trigger; ``run`` loops every interval)."""

    def __init__(self, balancer: Balancer, upstreams: Mapping[str, Upstream]) -> None:
        self.balancer = balancer
        self.upstreams = {
            name: upstream
            for name, upstream in upstreams.items()
            if upstream.config.actively_checked
        }

    async def run_once(self) -> dict[str, bool]:
        """Check every endpoint once; endpoint name -> whether it passed."""
        names = list(self.upstreams)
        results = await asyncio.gather(*(self.upstreams[n].check() for n in names))
        for name, passed in zip(names, results, strict=True):
            health = self.balancer.replicas[name].health
            if passed:
                if health.state != "healthy":
                    health.succeeded()
            else:
                log.warning("health check failed: endpoint %r", name)
                health.failed()
        return dict(zip(names, results, strict=True))

    async def run(self, interval_s: float) -> None:
        """Check every ``interval_s`` seconds until cancelled."""
        while True:
            await self.run_once()
            await asyncio.sleep(interval_s)
