"""Passive timing of every request: what the gateway saw, recorded off the hot path.

The request path fills one :class:`RequestTiming` per request and hands it to
``Telemetry.record`` when the response is finished; recording never delays a response.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    prediction_status: str = "none"
    error: str | None = None


class Telemetry:
    """Sink for request timings (Prometheus histograms + store roll-ups)."""

    def record(self, timing: RequestTiming) -> None:
        """Record one finished request; must return at once and never raise."""
