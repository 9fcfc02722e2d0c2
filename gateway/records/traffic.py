"""What real traffic leaves in the record store, and what is read back from it.

Telemetry hands each finished batch of requests over per endpoint: latency samples and
counters. They are stored as they are; accepted prediction tokens in that traffic are
passive evidence that speculation is on (noted at most once every
``PASSIVE_EVIDENCE_EVERY_S`` per endpoint). :func:`latency` reads the last hour back as
p50/p95 TTFT and TPOT plus the prediction-token totals.
"""

from __future__ import annotations

import time

from gateway.records.evidence import make
from gateway.records.store import WINDOW_S, RecordStore, Sample
from gateway.stats import percentile
from sdk.wire.endpoints import LatencySummary

PASSIVE_EVIDENCE_EVERY_S = 60.0


class TrafficRollup:
    """Writes batches of traffic roll-ups into one record store."""

    def __init__(self, store: RecordStore) -> None:
        self.store = store
        self._passive_noted: dict[str, float] = {}

    async def add(
        self, endpoint: str, samples: list[Sample], counts: dict[str, int], now: float
    ) -> None:
        """Store one endpoint's samples and counters of a batch; note passive evidence."""
        await self.store.add_samples(endpoint, samples)
        await self.store.add_counts(endpoint, counts)
        await self._note_passive(endpoint, counts, now)

    async def _note_passive(self, endpoint: str, c: dict[str, int], now: float) -> None:
        """Accepted prediction tokens in real traffic are evidence (at most once a minute)."""
        if not c.get("requests_with_accepted_tokens"):
            return
        if now - self._passive_noted.get(endpoint, 0.0) < PASSIVE_EVIDENCE_EVERY_S:
            return
        self._passive_noted[endpoint] = now
        accepted = c["accepted_prediction_tokens"]
        await self.store.add_evidence(
            endpoint,
            make(
                "passive",
                "traffic usage fields",
                "yes",
                f"{accepted} accepted prediction tokens in {c['requests_with_accepted_tokens']} "
                "recent requests",
                {"accepted_prediction_tokens": float(accepted)},
                observed_at=now,
            ),
        )


async def latency(store: RecordStore, endpoint: str, window_s: float = WINDOW_S) -> LatencySummary:
    """p50/p95 TTFT and TPOT over the window, and the endpoint's prediction-token totals."""
    samples = await store.samples(endpoint, time.time() - window_s)
    counts = await store.counts(endpoint)
    ttfts = [s[1] for s in samples if s[1] is not None]
    tpots = [s[2] for s in samples if s[2] is not None]
    return LatencySummary(
        window_s=window_s,
        requests=len(samples),
        ttft_p50=percentile(ttfts, 50),
        ttft_p95=percentile(ttfts, 95),
        tpot_p50=percentile(tpots, 50),
        tpot_p95=percentile(tpots, 95),
        accepted_prediction_tokens=counts.get("accepted_prediction_tokens", 0),
        rejected_prediction_tokens=counts.get("rejected_prediction_tokens", 0),
    )
