"""Passive timing of every request: what the gateway saw, measured off the hot path.

The request path fills one :class:`RequestTiming` per request and hands it to
``Telemetry.record`` when the response is finished; recording never delays a response.
Prometheus histograms are updated inline (cheap: each labelled child is looked up once and
kept); store roll-ups (TTFT/TPOT samples and prediction-token counters per endpoint) go
through a bounded queue drained in batches by a background task at most every
``DRAIN_EVERY_S``, and are dropped and counted when the queue is full. What the roll-ups
mean (passive evidence, latency summaries) is the records package's business
(:mod:`gateway.records.traffic`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from gateway.records.store import MemoryRecordStore, RecordStore, Sample
from gateway.records.traffic import TrafficRollup
from gateway.rolling import RollingWindow, Row

if TYPE_CHECKING:
    from local_verifier.events import EngineStats

log = logging.getLogger(__name__)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
DRAIN_EVERY_S = 0.05  # roll-ups are written in batches, one wake-up per window


@dataclass
class RequestTiming:
    """Timestamps are ``time.perf_counter()`` seconds; ``t_start`` is when the request arrived."""

    endpoint: str
    model: str
    stream: bool
    t_start: float
    status: int = 200
    t_first_byte: float | None = None
    t_first_content: float | None = None
    t_end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int | None = None
    output_tokens_estimated: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens a local endpoint's prefix cache held
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    prediction_status: str = "none"
    error: str | None = None

    def ttft(self) -> float | None:
        """Request arrival -> first chunk carrying content."""
        return None if self.t_first_content is None else self.t_first_content - self.t_start

    def e2e(self) -> float | None:
        """Request arrival -> last content (end of the response)."""
        return None if self.t_end is None else self.t_end - self.t_start

    def tokens(self) -> tuple[int | None, bool]:
        """Output tokens and whether the count is an estimate (usage missing)."""
        if self.output_tokens is not None:
            return self.output_tokens, self.output_tokens_estimated
        if self.chunk_tokens:
            return sum(self.chunk_tokens), True
        return None, True

    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output_tokens - 1)."""
        n, _ = self.tokens()
        if self.t_end is None or self.t_first_content is None or n is None or n < 2:
            return None
        return (self.t_end - self.t_first_content) / (n - 1)


class _Metrics:
    """The Prometheus series, in a registry of their own (one per app)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("endpoint", "model")

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        self.ttfb = hist(
            "draftgate_time_to_first_byte_seconds", "request -> first byte", _LATENCY_BUCKETS
        )
        self.ttft = hist(
            "draftgate_ttft_seconds", "request -> first content chunk", _LATENCY_BUCKETS
        )
        self.tpot = hist(
            "draftgate_tpot_seconds", "(e2e - TTFT) / (output_tokens - 1)", _GAP_BUCKETS
        )
        self.itl = hist("draftgate_itl_seconds", "gap between content chunks", _GAP_BUCKETS)
        self.chunk_tokens = hist(
            "draftgate_chunk_tokens", "tokens carried by one content chunk", _TOKEN_BUCKETS
        )
        self.e2e = hist("draftgate_e2e_seconds", "request -> last content", _LATENCY_BUCKETS)
        self.output_tokens = hist(
            "draftgate_output_tokens", "output tokens per request", _TOKEN_BUCKETS
        )
        self.requests = Counter(
            "draftgate_requests", "finished requests", (*labels, "status"), registry=registry
        )
        self.accepted = Counter(
            "draftgate_accepted_prediction_tokens",
            "accepted prediction tokens",
            labels,
            registry=registry,
        )
        self.rejected = Counter(
            "draftgate_rejected_prediction_tokens",
            "rejected prediction tokens",
            labels,
            registry=registry,
        )
        self.estimated = Counter(
            "draftgate_output_tokens_estimated",
            "requests whose output tokens were counted by tokenizer (no usage)",
            labels,
            registry=registry,
        )
        self.dropped = Counter(
            "draftgate_telemetry_dropped",
            "roll-ups dropped because the queue was full",
            registry=registry,
        )
        self.store_errors = Counter(
            "draftgate_telemetry_store_errors",
            "roll-up batches the store failed to take",
            registry=registry,
        )
        self.prefix_hit = Counter(
            "draftgate_prefix_cache_hit_tokens",
            "prompt tokens a local endpoint found in its prefix cache",
            ("endpoint",),
            registry=registry,
        )
        self.prefix_miss = Counter(
            "draftgate_prefix_cache_miss_tokens",
            "prompt tokens a local endpoint computed",
            ("endpoint",),
            registry=registry,
        )
        self.memory = Gauge(
            "draftgate_local_memory_bytes",
            "memory of a local endpoint by part",
            ("endpoint", "part"),
            registry=registry,
        )
        self.refused = Counter(
            "draftgate_refused",
            "requests refused from their headers before any route ran (no log line each)",
            ("status",),
            registry=registry,
        )
        self.preemptions = Counter(
            "draftgate_local_preemptions",
            "requests a local endpoint preempted (KV blocks taken back, recomputed later)",
            ("endpoint",),
            registry=registry,
        )


class Telemetry:
    """Sink for request timings (Prometheus histograms + store roll-ups)."""

    def __init__(
        self,
        store: RecordStore | None = None,
        *,
        registry: CollectorRegistry | None = None,
        max_queue: int = 10_000,
    ) -> None:
        self.store: RecordStore = store if store is not None else MemoryRecordStore()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._m = _Metrics(self.registry)
        # labelled children, kept after their first use (``labels()`` costs microseconds)
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}
        self._queue: queue.Queue[RequestTiming] = queue.Queue(maxsize=max_queue)
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake_pending = False
        self._rollup = TrafficRollup(self.store)
        self._engines: dict[str, Callable[[], EngineStats | None]] = {}  # read at each scrape
        self._preempted: dict[str, int] = {}  # endpoint -> the engine's count last exported
        self.recent = RollingWindow()  # the last minutes per endpoint (the dashboard's)

    def record(self, timing: RequestTiming) -> None:
        """Record one finished request; must return at once and never raise."""
        try:
            self._observe(timing)
            self._note_recent(timing)
            try:
                self._queue.put_nowait(timing)
            except queue.Full:
                self._m.dropped.inc()
                return
            self._wake_drain()
        except Exception:  # recording must never break a response
            log.exception("telemetry: recording a request failed")

    def watch_engine(self, endpoint: str, stats: Callable[[], EngineStats | None]) -> None:
        """Export a local engine's snapshot (``stats()``; None: not loaded) at each scrape:
        its memory by part and its preemptions so far."""
        self._engines[endpoint] = stats

    def metrics_text(self) -> bytes:
        """This app's series in Prometheus text format (for ``GET /metrics``)."""
        for endpoint, read in self._engines.items():
            snapshot = read()
            if snapshot is not None:
                self.set_memory(endpoint, snapshot.memory)
                self._count_preemptions(endpoint, snapshot.preemptions)
        return generate_latest(self.registry)

    def set_memory(self, endpoint: str, memory: dict[str, int]) -> None:
        """Export a local endpoint's memory (weights, KV reserved / in use, indexes) in bytes."""
        for part, value in memory.items():
            if isinstance(value, int | float):
                self._m.memory.labels(endpoint, part).set(value)

    def count_refusal(self, status: int) -> None:
        """Count one request refused before any route ran, by its status."""
        self._child(self._m.refused, str(status)).inc()

    def _count_preemptions(self, endpoint: str, total: int) -> None:
        """Advance the endpoint's counter to its engine's count of preemptions so far."""
        seen = self._preempted.get(endpoint, 0)
        if total > seen:
            self._m.preemptions.labels(endpoint).inc(total - seen)
            self._preempted[endpoint] = total

    async def flush(self) -> None:
        """Write every queued roll-up to the store now."""
        batch: list[RequestTiming] = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            await self._write(batch)

    async def aclose(self) -> None:
        """Stop the drain task, write what is queued, close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush()
        await self.store.aclose()

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(*labels)``, created on first use only (no zero-valued series)."""
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _observe(self, t: RequestTiming) -> None:
        m, child, ep, model = self._m, self._child, t.endpoint, t.model
        child(m.requests, ep, model, str(t.status)).inc()
        if t.t_first_byte is not None:
            child(m.ttfb, ep, model).observe(t.t_first_byte - t.t_start)
        if (ttft := t.ttft()) is not None:
            child(m.ttft, ep, model).observe(ttft)
        if (e2e := t.e2e()) is not None:
            child(m.e2e, ep, model).observe(e2e)
        if (tpot := t.tpot()) is not None:
            child(m.tpot, ep, model).observe(tpot)
        n, estimated = t.tokens()
        if n is not None:
            child(m.output_tokens, ep, model).observe(n)
            if estimated:
                child(m.estimated, ep, model).inc()
        if t.accepted_prediction_tokens:
            child(m.accepted, ep, model).inc(t.accepted_prediction_tokens)
        if t.rejected_prediction_tokens:
            child(m.rejected, ep, model).inc(t.rejected_prediction_tokens)
        if t.cached_tokens is not None and t.prompt_tokens is not None:
            child(m.prefix_hit, ep).inc(t.cached_tokens)
            child(m.prefix_miss, ep).inc(t.prompt_tokens - t.cached_tokens)

    def _note_recent(self, t: RequestTiming) -> None:
        n, _ = t.tokens()
        self.recent.add(
            t.endpoint,
            Row(
                at=self.recent.now(),
                error=t.error is not None or t.status >= 400,
                ttft=t.ttft(),
                tpot=t.tpot(),
                output_tokens=n or 0,
                accepted=t.accepted_prediction_tokens or 0,
            ),
        )

    def _wake_drain(self) -> None:
        """Have the drain task write the queue within ``DRAIN_EVERY_S`` (one timer per batch)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called off the event loop: the running drain task picks it up
            if self._loop is not None and self._wake is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._wake.set)
            return
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop = loop
            self._wake = asyncio.Event()
            self._wake_pending = False
            self._task = loop.create_task(self._drain(), name="draftgate-telemetry")
        if not self._wake_pending:
            assert self._wake is not None
            self._wake_pending = True
            loop.call_later(DRAIN_EVERY_S, self._wake.set)

    async def _drain(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._wake_pending = False
            await self.flush()

    async def _write(self, batch: list[RequestTiming]) -> None:
        now = time.time()
        samples: dict[str, list[Sample]] = defaultdict(list)
        counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for t in batch:
            self._observe_gaps(t)
            samples[t.endpoint].append((now, t.ttft(), t.tpot()))
            c = counts[t.endpoint]
            c["requests"] += 1
            c["errors"] += int(t.error is not None or t.status >= 400)
            if t.accepted_prediction_tokens is not None:
                c["requests_with_prediction_usage"] += 1
                c["accepted_prediction_tokens"] += t.accepted_prediction_tokens
                c["rejected_prediction_tokens"] += t.rejected_prediction_tokens or 0
                c["requests_with_accepted_tokens"] += int(t.accepted_prediction_tokens > 0)
        try:
            for endpoint, rows in samples.items():
                await self._rollup.add(endpoint, rows, dict(counts[endpoint]), now)
        except Exception as exc:  # a dead store loses roll-ups, never requests
            self._m.store_errors.inc()
            log.warning("telemetry: store write failed: %s", type(exc).__name__)

    def _observe_gaps(self, t: RequestTiming) -> None:
        itl = self._child(self._m.itl, t.endpoint, t.model)
        per_chunk = self._child(self._m.chunk_tokens, t.endpoint, t.model)
        for prev, cur in zip(t.chunk_times, t.chunk_times[1:], strict=False):
            itl.observe(cur - prev)
        for n in t.chunk_tokens:
            per_chunk.observe(n)
