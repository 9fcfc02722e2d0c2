"""The balancer's state as Prometheus series, read at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.routing.balancer import Balancer

STATES = ("healthy", "half-open", "ejected")


class ReplicaCollector(Collector):
    """``draftgate_endpoint_state{endpoint,state}`` (1 for the current state),
    ``draftgate_endpoint_in_flight``, ``draftgate_endpoint_latency_ewma_seconds``,
    ``draftgate_endpoint_routed`` and ``draftgate_endpoint_ejections``."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "draftgate_endpoint_state", "health state of an endpoint", labels=["endpoint", "state"]
        )
        in_flight = GaugeMetricFamily(
            "draftgate_endpoint_in_flight", "requests in flight", labels=["endpoint"]
        )
        latency = GaugeMetricFamily(
            "draftgate_endpoint_latency_ewma_seconds",
            "moving average of request latency",
            labels=["endpoint"],
        )
        routed = CounterMetricFamily(
            "draftgate_endpoint_routed", "requests sent to the endpoint", labels=["endpoint"]
        )
        ejections = CounterMetricFamily(
            "draftgate_endpoint_ejections", "times the endpoint was ejected", labels=["endpoint"]
        )
        for name, replica in self.balancer.replicas.items():
            current = replica.health.state
            for s in STATES:
                state.add_metric([name, s], 1.0 if s == current else 0.0)
            in_flight.add_metric([name], replica.in_flight)
            if replica.latency_ewma_s is not None:
                latency.add_metric([name], replica.latency_ewma_s)
            routed.add_metric([name], replica.requests)
            ejections.add_metric([name], replica.health.ejections)
        yield from (state, in_flight, latency, routed, ejections)
