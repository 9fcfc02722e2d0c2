"""One audited request, streamed through the SDK's client and timed from the client's side."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sdk import AsyncClient
from sdk.errors import APIStatusError, APIStreamError, DraftgateError
from sdk.wire import ChatCompletionChunk, Usage


@dataclass
class RequestRecord:
    """Everything measured about one request. Times are seconds; ``t_sent`` is relative to
    the start of the audit; the other ``*_s`` fields are relative to ``t_sent``."""

    item: str
    category: str
    config: str
    setting: str
    concurrency: int
    round: int
    language: str | None = None
    t_scheduled: float = 0.0
    t_sent: float = 0.0
    queued_s: float = 0.0
    status: int | None = None
    error: str | None = None
    error_message: str | None = None
    ttfb_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    chunk_offsets_s: list[float] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)
    output_tokens: int | None = None
    tokens_source: str = "usage"
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    draft_stats: dict[str, Any] | None = None
    finish_reason: str | None = None
    prediction_header: str | None = None
    served_by: str | None = None
    overhead_ms: float | None = None
    text: str = ""

    def ok(self) -> bool:
        return self.error is None and self.ttft_s is not None and self.e2e_s is not None

    def tpot_s(self) -> float | None:
        """TPOT = (e2e - TTFT) / (output_tokens - 1)."""
        if not self.ok() or self.output_tokens is None or self.output_tokens < 2:
            return None
        assert self.e2e_s is not None and self.ttft_s is not None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def itl_s(self) -> list[float]:
        """Gaps between consecutive content chunks."""
        offs = self.chunk_offsets_s
        return [b - a for a, b in zip(offs, offs[1:], strict=False)]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot_s"] = self.tpot_s()
        return data


def _usage(rec: RequestRecord, usage: Usage) -> None:
    rec.output_tokens = usage.completion_tokens
    rec.prompt_tokens = usage.prompt_tokens
    if usage.prompt_tokens_details is not None:
        rec.cached_tokens = usage.prompt_tokens_details.cached_tokens
    details = usage.completion_tokens_details
    if details is not None:
        rec.accepted_prediction_tokens = details.accepted_prediction_tokens
        rec.rejected_prediction_tokens = details.rejected_prediction_tokens


def _answered(rec: RequestRecord, headers: httpx.Headers) -> None:
    rec.prediction_header = headers.get("x-draftgate-prediction")
    rec.served_by = headers.get("x-draftgate-endpoint")
    overhead = headers.get("x-draftgate-overhead-ms")
    rec.overhead_ms = float(overhead) if overhead else None


def _chunk(rec: RequestRecord, chunk: ChatCompletionChunk, at: float, parts: list[str]) -> None:
    for choice in chunk.choices:
        content = choice.delta.content
        if content:
            if rec.ttft_s is None:
                rec.ttft_s = at
            rec.chunk_offsets_s.append(at)
            rec.chunk_chars.append(len(content))
            parts.append(content)
        if choice.finish_reason:
            rec.finish_reason = choice.finish_reason
    if chunk.usage is not None:
        _usage(rec, chunk.usage)
    stats = (chunk.model_extra or {}).get("draftgate")
    if isinstance(stats, dict):
        rec.draft_stats = stats


def _failed(rec: RequestRecord, exc: DraftgateError) -> None:
    if isinstance(exc, APIStatusError):
        rec.status = exc.status_code
        rec.error = f"http_{exc.status_code}"
        rec.error_message = exc.error.message[:300]
        _answered(rec, exc.headers)
    elif isinstance(exc, APIStreamError) and exc.body is not None:
        rec.error = f"stream_error:{exc.body.error.type or 'unknown'}"
        rec.error_message = exc.body.error.message[:300]
    elif isinstance(exc, APIStreamError):
        rec.error = "truncated" if "[DONE]" in str(exc) else "bad_event"
        rec.error_message = str(exc)[:300]
    else:
        cause = exc.__cause__
        rec.error = type(cause).__name__ if cause is not None else type(exc).__name__
        rec.error_message = str(exc)[:300]


async def stream_chat(
    client: AsyncClient, request: dict[str, Any], rec: RequestRecord, origin: float
) -> RequestRecord:
    """Send ``request`` (keyword arguments of ``AsyncClient.chat``) as a streaming chat
    completion and fill ``rec``; never raises for an endpoint failure, which is recorded
    in ``rec.error``."""
    sent = time.perf_counter()
    rec.t_sent = sent - origin
    parts: list[str] = []
    try:
        stream = await client.chat(**request, stream=True, stream_options={"include_usage": True})
        rec.ttfb_s = time.perf_counter() - sent
        rec.status = stream.response.status_code
        _answered(rec, stream.response.headers)
        async with stream:
            async for chunk in stream:
                _chunk(rec, chunk, time.perf_counter() - sent, parts)
    except DraftgateError as exc:
        _failed(rec, exc)
    rec.text = "".join(parts)
    if rec.chunk_offsets_s:
        rec.e2e_s = rec.chunk_offsets_s[-1]
    if rec.output_tokens is None and rec.chunk_offsets_s:
        rec.output_tokens = len(rec.chunk_offsets_s)
        rec.tokens_source = "estimate:chunks"
    return rec
