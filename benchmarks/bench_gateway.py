"""Gateway overhead: the same requests direct to a zero-delay upstream and through the
gateway, paired and interleaved, non-streaming and streaming, at several concurrencies.

    python -m benchmarks.bench_gateway --json OUT [--requests 2000] [--concurrency 1,16] [--smoke]

The upstream, the gateway and the client run as three processes. The client is one
aiohttp session on uvloop (C-accelerated HTTP parsing), cheap enough per request that at
concurrency 16 the latencies measure the servers rather than the client's own event loop.
With a zero-delay upstream, 16 workers keep the gateway near saturation, so added latency
at c16 is mostly queueing behind the gateway's CPU cost per request.
Each worker sends pairs (direct, gateway) in alternating order (ABBA), so drift hits
both sides alike.
Added latency = percentile(through gateway) - percentile(direct); the paired
differences' percentiles are reported too. JSON: ``added_ms.{c1,c16}.{p50,p99}``,
``added_ms_stream`` likewise, plus requests/s and the raw percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import asgi_server, gateway, parse, pct, write_json

if sys.platform != "win32":
    from uvloop import run as _run  # the loop uvicorn gives the servers
else:  # pragma: no cover - no uvloop on Windows
    _run = asyncio.run

SMOKE = ("--requests", "40", "--concurrency", "1,4")
CHAT = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there, general."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
}
CHAT_BODY = json.dumps(CHAT).encode()
STREAM_EVENTS = [
    b"data: "
    + json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
        }
    ).encode()
    + b"\n\n"
    for word in ("Hello", " there", ",", " general", ".")
] + [b"data: [DONE]\n\n"]
JSON_HEADERS = {"content-type": "application/json"}
REQUEST = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Say hello, briefly."}],
    "max_tokens": 8,
}


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Zero-delay OpenAI-style upstream: a fixed answer, streamed or not."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if b'"stream":true' in body.replace(b" ", b""):
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for event in STREAM_EVENTS:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(CHAT_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": CHAT_BODY})


def gateway_config(upstream: str) -> dict[str, Any]:
    """The gateway in front of ``upstream``, no auth, limits no load test reaches (the
    defaults would refuse a closed loop of thousands of requests a minute with 429)."""
    return {
        "endpoints": [
            {
                "name": "bench",
                "kind": "openai_compatible",
                "base_url": f"{upstream}/v1",
                "models": ["bench"],
            }
        ],
        "auth": False,
        "limits": {"requests_per_minute": 10**9, "tokens_per_minute": 10**12},
    }


async def _wait_ready(url: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/chat/completions", json=REQUEST) as r,
    ):
        await r.read()
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}")


OVERHEAD: list[float] = []  # what the gateway itself reports (X-Draftgate-Overhead-Ms)


async def _one(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    """One request, its whole body read (chunk by chunk as it arrives); seconds taken."""
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=JSON_HEADERS) as r:
        async for _ in r.content.iter_any():
            pass
    elapsed = time.perf_counter() - t0
    if r.status != 200:
        raise RuntimeError(f"{url}: HTTP {r.status}")
    reported = r.headers.get("x-draftgate-overhead-ms")
    if reported is not None:
        OVERHEAD.append(float(reported))
    return elapsed


async def _measure(
    direct: str, gateway: str, concurrency: int, requests: int, stream: bool
) -> dict[str, Any]:
    per_worker = max(1, requests // concurrency)
    body = json.dumps({**REQUEST, "stream": stream}).encode()
    results: list[tuple[float, float]] = []
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        d_url, g_url = f"{direct}/v1/chat/completions", f"{gateway}/v1/chat/completions"
        for _ in range(20):  # warm-up: connections and code paths
            await _one(session, d_url, body)
            await _one(session, g_url, body)

        async def worker(offset: int) -> None:
            for i in range(per_worker):
                if (i + offset) % 2 == 0:
                    d = await _one(session, d_url, body)
                    g = await _one(session, g_url, body)
                else:
                    g = await _one(session, g_url, body)
                    d = await _one(session, d_url, body)
                results.append((d, g))

        OVERHEAD.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
    direct_s = [d for d, _ in results]
    gateway_s = [g for _, g in results]
    diffs = [g - d for d, g in results]
    ms = 1000.0
    return {
        "n": len(results),
        "p50": (pct(gateway_s, 50) - pct(direct_s, 50)) * ms,
        "p99": (pct(gateway_s, 99) - pct(direct_s, 99)) * ms,
        "paired_diff_p50": pct(diffs, 50) * ms,
        "paired_diff_p99": pct(diffs, 99) * ms,
        "direct_p50_ms": pct(direct_s, 50) * ms,
        "direct_p99_ms": pct(direct_s, 99) * ms,
        "gateway_p50_ms": pct(gateway_s, 50) * ms,
        "gateway_p99_ms": pct(gateway_s, 99) * ms,
        "direct_req_per_s": concurrency / statistics.fmean(direct_s),
        "gateway_req_per_s": concurrency / statistics.fmean(gateway_s),
        "wall_s": wall,
        "reported_overhead_p50_ms": pct(OVERHEAD, 50),
        "reported_overhead_p99_ms": pct(OVERHEAD, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--requests", type=int, default=2000, help="pairs per configuration")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated levels")
    args = parse(parser, SMOKE)
    levels = [int(c) for c in args.concurrency.split(",")]

    with asgi_server(upstream_app) as up, gateway(gateway_config(up.url)) as gw:
        _run(_wait_ready(up.url))
        _run(_wait_ready(gw.url))
        out: dict[str, Any] = {"requests": args.requests, "added_ms": {}, "added_ms_stream": {}}
        for level in levels:
            for key, stream in (("added_ms", False), ("added_ms_stream", True)):
                result = _run(_measure(up.url, gw.url, level, args.requests, stream))
                out[key][f"c{level}"] = result
                print(
                    f"{'stream' if stream else 'plain '} c{level:<3} added p50 {result['p50']:.3f} ms  "
                    f"p99 {result['p99']:.3f} ms  (paired p50 {result['paired_diff_p50']:.3f}, "
                    f"p99 {result['paired_diff_p99']:.3f})  gateway {result['gateway_req_per_s']:.0f} req/s  "
                    f"direct {result['direct_req_per_s']:.0f} req/s  "
                    f"header p50 {result['reported_overhead_p50_ms']:.3f} ms",
                    flush=True,
                )
    write_json(args.json, out)


if __name__ == "__main__":
    main()
