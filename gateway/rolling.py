"""The last minutes of traffic per endpoint, in this process's memory (the dashboard's
live figures): one small row per finished request, rows older than ``KEEP_S`` dropped
as new ones arrive and at most ``MAX_ROWS`` kept per endpoint."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.stats import percentile

KEEP_S = 300.0
MAX_ROWS = 20_000


@dataclass(frozen=True)
class Row:
    """One finished request: when (monotonic seconds), whether it failed, its latencies
    (seconds, None when not measured), output tokens and accepted prediction tokens."""

    at: float
    error: bool
    ttft: float | None
    tpot: float | None
    output_tokens: int
    accepted: int


@dataclass(frozen=True)
class Figures:
    """One endpoint's traffic over a span: rates per second, latency percentiles (seconds)
    and the share of output tokens that accepted drafts supplied (None: no output)."""

    requests: int
    errors: int
    requests_per_s: float
    output_tokens_per_s: float
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    drafted_share: float | None


class RollingWindow:
    """Rows of the last ``KEEP_S`` seconds per endpoint."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rows: dict[str, deque[Row]] = {}

    def add(self, endpoint: str, row: Row) -> None:
        rows = self._rows.get(endpoint)
        if rows is None:
            rows = self._rows[endpoint] = deque(maxlen=MAX_ROWS)
        rows.append(row)
        while rows and rows[0].at < row.at - KEEP_S:
            rows.popleft()

    def now(self) -> float:
        return self._clock()

    def endpoints(self) -> list[str]:
        return sorted(self._rows)

    def rows(self, endpoint: str, since: float) -> list[Row]:
        """The endpoint's rows at or after ``since`` (monotonic seconds)."""
        return [r for r in list(self._rows.get(endpoint, ())) if r.at >= since]

    def figures(self, endpoint: str, span_s: float) -> Figures:
        """The endpoint's figures over the last ``span_s`` seconds."""
        rows = self.rows(endpoint, self._clock() - span_s)
        ttfts = [r.ttft for r in rows if r.ttft is not None]
        tpots = [r.tpot for r in rows if r.tpot is not None]
        output = sum(r.output_tokens for r in rows)
        accepted = sum(r.accepted for r in rows)
        return Figures(
            requests=len(rows),
            errors=sum(r.error for r in rows),
            requests_per_s=len(rows) / span_s,
            output_tokens_per_s=output / span_s,
            ttft_p50=percentile(ttfts, 50),
            ttft_p99=percentile(ttfts, 99),
            tpot_p50=percentile(tpots, 50),
            tpot_p99=percentile(tpots, 99),
            drafted_share=min(1.0, accepted / output) if output else None,
        )

    def series(self, endpoint: str, span_s: float, buckets: int) -> list[tuple[int, int]]:
        """Requests and output tokens per bucket over the last ``span_s`` seconds, oldest
        bucket first."""
        now = self._clock()
        width = span_s / buckets
        counts = [[0, 0] for _ in range(buckets)]
        for r in self.rows(endpoint, now - span_s):
            i = min(buckets - 1, int((r.at - (now - span_s)) / width))
            counts[i][0] += 1
            counts[i][1] += r.output_tokens
        return [(c[0], c[1]) for c in counts]
