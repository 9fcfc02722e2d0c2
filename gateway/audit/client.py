"""One audited request over streaming HTTP, timed from the client's side."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx


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


def _usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    rec.output_tokens = usage.get("completion_tokens")
    rec.prompt_tokens = usage.get("prompt_tokens")
    details = usage.get("completion_tokens_details") or {}
    rec.accepted_prediction_tokens = details.get("accepted_prediction_tokens")
    rec.rejected_prediction_tokens = details.get("rejected_prediction_tokens")


def _error_event(rec: RequestRecord, error: Any) -> None:
    err = error if isinstance(error, dict) else {"message": str(error)}
    rec.error = f"stream_error:{err.get('type') or 'unknown'}"
    rec.error_message = str(err.get("message", ""))[:300]


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    rec: RequestRecord,
    origin: float,
) -> RequestRecord:
    """Send ``body`` as a streaming chat completion and fill ``rec`` (never raises for an
    endpoint failure: it is recorded in ``rec.error``)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    rec.t_sent = sent - origin
    parts: list[str] = []
    done = False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            rec.status = resp.status_code
            rec.ttfb_s = time.perf_counter() - sent
            rec.prediction_header = resp.headers.get("x-draftgate-prediction")
            rec.served_by = resp.headers.get("x-draftgate-endpoint")
            overhead = resp.headers.get("x-draftgate-overhead-ms")
            rec.overhead_ms = float(overhead) if overhead else None
            if resp.status_code >= 400:
                raw = await resp.aread()
                rec.error = f"http_{resp.status_code}"
                rec.error_message = raw.decode("utf-8", "replace")[:300]
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    _error_event(rec, event["error"])
                    break
                now = time.perf_counter() - sent
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if rec.ttft_s is None:
                            rec.ttft_s = now
                        rec.chunk_offsets_s.append(now)
                        rec.chunk_chars.append(len(content))
                        parts.append(content)
                    if choice.get("finish_reason"):
                        rec.finish_reason = choice["finish_reason"]
                if event.get("usage"):
                    _usage(rec, event["usage"])
                if isinstance(event.get("draftgate"), dict):
                    rec.draft_stats = event["draftgate"]
    except httpx.HTTPError as exc:
        rec.error = type(exc).__name__
        rec.error_message = str(exc)[:300]
    except json.JSONDecodeError:
        rec.error = "bad_event"
        rec.error_message = "an SSE event was not valid JSON"
    rec.text = "".join(parts)
    if rec.error is None and not done:
        rec.error = "truncated"
        rec.error_message = "the stream ended without [DONE]"
    if rec.chunk_offsets_s:
        rec.e2e_s = rec.chunk_offsets_s[-1]
    if rec.output_tokens is None and rec.chunk_offsets_s:
        rec.output_tokens = len(rec.chunk_offsets_s)
        rec.tokens_source = "estimate:chunks"
    return rec
