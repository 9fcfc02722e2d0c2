"""One abusive tenant against honest ones: does the gateway keep serving the honest clients?

    python -m benchmarks.bench_abuse --json OUT [--seconds 20] [--rounds 2] [--redis-url URL]
                                     [--watch-loop] [--smoke]
    python -m benchmarks.bench_abuse --json OUT --cpu-per-request 20

Four honest clients stream chat completions in a loop (each starting at most one request
every 250 ms, so the honest tenant stays within its default 1200 requests a minute) while
``/healthz`` is polled every 50 ms; in the abuse phases one more tenant (in a process of its
own) sends the worst inputs it can, all at once and in a loop: 1 MB prompts of fenced lines with capture on, 100k document ids, oversized
audits, documents with 1 MB paths, and slow uploads (a declared 1 MB body trickled at
100 bytes a second). Phases without and with the abuser alternate (``--rounds`` of each,
ABAB) so drift hits both alike. Reported: the honest clients' TTFT and ``/healthz``
latency percentiles per condition, their errors, what the abuser got back, and whether
the honest tenant's documents in Redis all survived.

The upstream is a stand-in that streams 16 chunks 10 ms apart (the embedded SmolLM2 on a
shared 2-core machine would make TTFT mostly engine queueing, hiding the gateway); the
gateway runs as ``draftgate serve`` runs it (uvicorn, httptools, uvloop) with Redis.

``--cpu-per-request N`` measures instead what one abusive request of each kind costs the
gateway process in CPU time (all its threads, from ``/proc``; Linux, net of what the idle
gateway uses), sent one at a time: admitted (limits raised) and refused (the abuser's
tokens spent), with the longest slice of its event loop's time one such request held (the
loop thread's CPU time between two ticks of a 1 ms timer): how long an honest request may
wait behind it. CPU time is what takes the event loop's share from the honest clients, and
unlike latency it can be read on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import re
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import Served, asgi_server, cpu_s, gateway, parse, pct, write_json

if sys.platform != "win32":
    from uvloop import run as _run
else:  # pragma: no cover - no uvloop on Windows
    _run = asyncio.run

SMOKE = ("--seconds", "1", "--rounds", "1")
HONEST_KEY = "honest-key-0123456789"
# each honest client starts at most one request per period: 4 clients stay at <= 960
# requests a minute, within the default limit of 1200 a tenant may send
HONEST_PERIOD_S = 0.25
ABUSER_KEY = "abuser-key-0123456789"
CHUNKS = 16
CHUNK_GAP_S = 0.010
HONEST_CLIENTS = 4
REQUEST = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Say hello, briefly."}],
    "max_tokens": 32,
    "stream": True,
}


STREAM = re.compile(rb'"stream"\s*:\s*true')


def _event(content: str) -> bytes:
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An OpenAI-style upstream streaming ``CHUNKS`` chunks ``CHUNK_GAP_S`` apart."""
    if scope["type"] != "http":
        return
    chunks = []  # joined once: a 1 MB body added up chunk by chunk is copied many times
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    if not STREAM.search(b"".join(chunks)):
        answer = json.dumps(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": 0,
                "model": "bench",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": answer})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for i in range(CHUNKS):
        await asyncio.sleep(CHUNK_GAP_S)
        await send({"type": "http.response.body", "body": _event(f" w{i}"), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _watch_slices(app: Any, longest: Any) -> Any:
    """``app`` with a task on its event loop that, while ``longest[2]`` is set, keeps in
    ``longest[0]`` and ``longest[1]`` (a shared array) the longest the loop ran other
    callbacks between two of its 1 ms ticks: the event loop thread's CPU ms (which a busy
    machine does not inflate), and the wall ms (which also count waits for the GIL and
    preemption). Unset, it ticks every 100 ms (its ticks cost CPU)."""
    ticking: list[asyncio.Task[None]] = []

    async def tick() -> None:
        while True:
            cpu, wall = time.thread_time(), time.perf_counter()
            while longest[2]:
                await asyncio.sleep(0.001)
                now_cpu, now_wall = time.thread_time(), time.perf_counter()
                longest[0] = max(longest[0], 1000 * (now_cpu - cpu))
                longest[1] = max(longest[1], 1000 * (now_wall - wall - 0.001))
                cpu, wall = now_cpu, now_wall
            await asyncio.sleep(0.1)

    async def watched(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and not ticking:
            ticking.append(asyncio.get_running_loop().create_task(tick()))
        await app(scope, receive, send)

    return watched


def _config(upstream: str, redis_url: str, limits: dict[str, int]) -> dict[str, Any]:
    """The gateway in front of ``upstream`` with capture on, Redis (keys under a prefix of
    their own) and ``limits`` (empty: the defaults)."""
    return {
        "endpoints": [
            {
                "name": "up",
                "kind": "openai_compatible",
                "base_url": f"{upstream}/v1",
                "models": ["bench"],
            }
        ],
        "keys": [
            {"key_env": "BENCH_HONEST_KEY", "tenant": "honest"},
            {"key_env": "BENCH_ABUSER_KEY", "tenant": "abuser"},
        ],
        "redis": {"url": redis_url, "prefix": f"dgbench:{uuid.uuid4().hex[:8]}:"},
        "capture": True,
        "limits": limits,
    }


@contextlib.contextmanager
def _served(redis_url: str, limits: dict[str, int], longest: Any = None) -> Iterator[Served]:
    """The stand-in upstream and the gateway, each in its own process; with ``longest``,
    the gateway's event loop's longest slices kept there (:func:`_watch_slices`)."""
    environ = {"BENCH_HONEST_KEY": HONEST_KEY, "BENCH_ABUSER_KEY": ABUSER_KEY}
    wrap = None if longest is None else partial(_watch_slices, longest=longest)
    with (
        asgi_server(upstream_app) as up,
        gateway(_config(up.url, redis_url, limits), environ, wrap) as served,
    ):
        yield served


class Run:
    """What one phase measured."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.headers: list[float] = []  # time to the response's headers
        self.overhead: list[float] = []  # the gateway's own time before them (its header)
        self.health: list[float] = []
        self.errors: Counter[str] = Counter()
        self.abuser: Counter[str] = Counter()


async def _honest(session: aiohttp.ClientSession, url: str, run: Run, stop: float) -> None:
    headers = {"authorization": f"Bearer {HONEST_KEY}"}
    t0 = time.perf_counter()
    while t0 < stop:
        await _pace(t0)
        t0 = time.perf_counter()
        try:
            async with session.post(
                f"{url}/v1/chat/completions", json=REQUEST, headers=headers
            ) as r:
                headers_at = time.perf_counter() - t0
                if r.status != 200:
                    run.errors[f"status {r.status}"] += 1
                    await r.read()
                    continue
                first = None
                body = b""
                async for chunk in r.content.iter_any():
                    if first is None and b'"content"' in chunk:
                        first = time.perf_counter() - t0
                    body += chunk
                if first is None or b"[DONE]" not in body or b'"error"' in body:
                    run.errors["broken stream"] += 1
                else:
                    run.ttft.append(first)
                    run.headers.append(headers_at)
                    run.overhead.append(float(r.headers["x-draftgate-overhead-ms"]) / 1000)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            run.errors[type(exc).__name__] += 1


async def _pace(last_start: float) -> None:
    """Wait until ``HONEST_PERIOD_S`` after the client's previous request started."""
    await asyncio.sleep(max(0.0, last_start + HONEST_PERIOD_S - time.perf_counter()))


async def _health(session: aiohttp.ClientSession, url: str, run: Run, stop: float) -> None:
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        try:
            async with session.get(f"{url}/healthz") as r:
                await r.read()
                if r.status != 200:
                    run.errors[f"healthz {r.status}"] += 1
            run.health.append(time.perf_counter() - t0)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            run.errors[f"healthz {type(exc).__name__}"] += 1
        await asyncio.sleep(0.05)


def _abuses() -> dict[str, tuple[str, bytes]]:
    """Path and body of each abusive request."""
    fenced = "```a\n" * (200_000)  # 1 MB of fence lines
    chat = {"model": "bench", "max_tokens": 16}
    return {
        "fenced-1MB": (
            "/v1/chat/completions",
            json.dumps({**chat, "messages": [{"role": "user", "content": fenced}]}).encode(),
        ),
        "100k-ids": (
            "/v1/chat/completions",
            json.dumps(
                {
                    **chat,
                    "messages": [{"role": "user", "content": "hi"}],
                    "draftgate": {"documents": [f"doc{i}.py" for i in range(100_000)]},
                }
            ).encode(),
        ),
        "audit": (
            "/v1/audits",
            json.dumps(
                {"endpoint": "up", "requests": 10**9, "concurrency": [10**7], "max_tokens": 10**6}
            ).encode(),
        ),
        "1MB-path": (
            "/v1/documents",
            json.dumps({"id": "p", "text": "", "path": "p/" * 500_000}).encode(),
        ),
    }


async def _abuse(
    session: aiohttp.ClientSession,
    url: str,
    name: str,
    path: str,
    body: bytes,
    run: Run,
    stop: float,
) -> None:
    headers = {"authorization": f"Bearer {ABUSER_KEY}", "content-type": "application/json"}
    while time.perf_counter() < stop:
        try:
            async with session.post(f"{url}{path}", data=body, headers=headers) as r:
                await r.read()
                run.abuser[f"{name} {r.status}"] += 1
                if r.status == 429:  # what a real abuser would not do: wait as told
                    await asyncio.sleep(min(float(r.headers.get("retry-after", "1")), 1.0))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            run.abuser[f"{name} {type(exc).__name__}"] += 1


async def _slow_upload(port: int, run: Run, stop: float) -> None:
    """A declared 1 MB document body trickled at 100 bytes a second."""
    while time.perf_counter() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            run.abuser["slow-upload connect failed"] += 1
            await asyncio.sleep(0.1)
            continue
        writer.write(
            b"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + ABUSER_KEY.encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
        )
        status = "closed"
        try:
            while time.perf_counter() < stop:
                writer.write(b" " * 100)
                await writer.drain()
                try:
                    line = await asyncio.wait_for(reader.readline(), 1.0)
                except asyncio.TimeoutError:
                    continue
                status = line.decode(errors="replace").split(" ")[1] if line else "closed"
                break
        except OSError:
            status = "reset"
        run.abuser[f"slow-upload {status}"] += 1
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if status == "429":  # waits as the other abusers do
            await asyncio.sleep(1.0)


ABUSES = ("fenced-1MB", "100k-ids", "audit", "1MB-path", "slow-upload")


async def _abuser(port: int, stop: float, abuses: tuple[str, ...]) -> Counter[str]:
    """The abusive tenant's loops until ``stop`` (perf_counter); what it got back."""
    url = f"http://127.0.0.1:{port}"
    run = Run()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as bad:
        tasks = [
            _abuse(bad, url, name, path, body, run, stop)
            for name, (path, body) in _abuses().items()
            if name in abuses
        ]
        if "slow-upload" in abuses:
            tasks += [_slow_upload(port, run, stop) for _ in range(4)]
        await asyncio.gather(*tasks)
    return run.abuser


def _run_abuser(port: int, abuses: tuple[str, ...], pipe: Any) -> None:
    """The abuser in a process of its own, as a real one would be: its requests must not
    slow the honest clients' event loop, only the gateway. Says it is ready, takes the
    phase's length, answers what it got back."""
    pipe.send("ready")
    seconds = pipe.recv()
    pipe.send(dict(_run(_abuser(port, time.perf_counter() + seconds, abuses))))


async def _phase(
    url: str, port: int, seconds: float, abuser: bool, abuses: tuple[str, ...] = ABUSES
) -> Run:
    run = Run()
    process = None
    if abuser:
        pipe, child = multiprocessing.get_context("spawn").Pipe()
        process = multiprocessing.get_context("spawn").Process(
            target=_run_abuser, args=(port, abuses, child), daemon=True
        )
        process.start()
        await asyncio.to_thread(pipe.recv)  # its imports done: both start together
        pipe.send(seconds)
    stop = time.perf_counter() + seconds
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as honest,
        aiohttp.ClientSession(timeout=timeout) as health,
    ):
        tasks = [_honest(honest, url, run, stop) for _ in range(HONEST_CLIENTS)]
        tasks.append(_health(health, url, run, stop))
        await asyncio.gather(*tasks)
    if process is not None:
        run.abuser.update(await asyncio.to_thread(pipe.recv))
        process.join(10)
    return run


async def _put_honest_documents(url: str, count: int) -> dict[str, str]:
    headers = {"authorization": f"Bearer {HONEST_KEY}"}
    shas = {}
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            doc = {"id": f"src/m{i}.py", "text": f"def f{i}(x):\n    return x + {i}\n" * 20}
            async with session.post(f"{url}/v1/documents", json=doc, headers=headers) as r:
                shas[doc["id"]] = (await r.json())["sha256"]
    return shas


async def _honest_documents(url: str) -> dict[str, str]:
    """The honest tenant's documents once the store answers (a circuit opened by the
    abuse phase closes within seconds)."""
    headers = {"authorization": f"Bearer {HONEST_KEY}"}
    async with aiohttp.ClientSession() as session:
        for _ in range(30):
            async with session.get(f"{url}/v1/documents", headers=headers) as r:
                answer = await r.json()
                if r.status == 200:
                    return {d["id"]: d["sha256"] for d in answer["data"]}
            await asyncio.sleep(1.0)
    raise RuntimeError(f"listing the honest documents: {r.status} {answer}")


def _percentiles(values: list[float]) -> dict[str, float | None]:
    """p50 and p99 of ``values`` (seconds) in ms."""
    return {
        "p50": 1000 * statistics.median(values) if values else None,
        "p99": 1000 * pct(values, 99) if values else None,
    }


def _summary(runs: list[Run]) -> dict[str, Any]:
    ttft = [t for r in runs for t in r.ttft]
    errors: Counter[str] = sum((r.errors for r in runs), Counter())
    abuser: Counter[str] = sum((r.abuser for r in runs), Counter())
    return {
        "honest_requests": len(ttft),
        "honest_errors": dict(errors),
        "ttft_ms": _percentiles(ttft),
        # where an honest TTFT goes: to the response's headers (of which the gateway's own
        # time, X-Draftgate-Overhead-Ms: the rest is the upstream and the network), then to
        # the first content (the upstream's first chunk, relayed)
        "headers_ms": _percentiles([h for r in runs for h in r.headers]),
        "gateway_overhead_ms": _percentiles([o for r in runs for o in r.overhead]),
        "healthz_ms": _percentiles([t for r in runs for t in r.health]),
        "abuser": dict(sorted(abuser.items())),
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    longest = multiprocessing.get_context("spawn").Array("d", 3, lock=False)
    slices: dict[str, list[float]] = {"without": [0.0, 0.0], "with": [0.0, 0.0]}
    with _served(args.redis_url, {}, longest if args.watch_loop else None) as served:
        url, port = served.url, served.port
        stored = await _put_honest_documents(url, 50)
        await _phase(url, port, 3, abuser=False)  # warm-up
        runs: dict[str, list[Run]] = {"without": [], "with": []}
        for _ in range(args.rounds):
            for condition in ("without", "with"):
                longest[:] = [0.0, 0.0, 1.0]
                runs[condition].append(
                    await _phase(url, port, args.seconds, condition == "with", args.abuses)
                )
                longest[2] = 0.0
                slices[condition] = [
                    max(a, b) for a, b in zip(slices[condition], longest[:2], strict=True)
                ]
        kept = await _honest_documents(url)
    without, with_ = _summary(runs["without"]), _summary(runs["with"])
    if args.watch_loop:  # the gateway's longest event-loop slices in each condition
        for summary, condition in ((without, "without"), (with_, "with")):
            cpu, wall = slices[condition]
            summary["longest_loop_slice_ms"] = {"cpu": round(cpu, 2), "wall": round(wall, 2)}
    return {
        "seconds_per_phase": args.seconds,
        "rounds": args.rounds,
        "honest_clients": HONEST_CLIENTS,
        "abuses": list(args.abuses),
        "upstream": f"stand-in, {CHUNKS} chunks {CHUNK_GAP_S * 1000:.0f} ms apart",
        "without_abuser": without,
        "with_abuser": with_,
        "ttft_p99_ratio": with_["ttft_ms"]["p99"] / without["ttft_ms"]["p99"],
        "healthz_p99_ratio": with_["healthz_ms"]["p99"] / without["healthz_ms"]["p99"],
        "honest_documents": {
            "stored": len(stored),
            "kept_unchanged": sum(kept.get(k) == v for k, v in stored.items()),
        },
    }


UNLIMITED = {"tokens_per_minute": 10**12, "requests_per_minute": 10**9, "uploads_per_minute": 10**9}


async def _settled_cpu_s(pid: int, idle_per_s: float) -> float:
    """The gateway's CPU seconds once it is idle again (captures run after the answers):
    over 0.3 s it used no more than ``idle_per_s`` (its CPU seconds a second when idle)
    and 5 ms."""
    last = cpu_s(pid)
    while True:
        await asyncio.sleep(0.3)
        now = cpu_s(pid)
        if now - last < 0.005 + 0.3 * idle_per_s:
            return now
        last = now


async def _idle_cpu_per_s(pid: int, seconds: float = 3.0) -> float:
    """The gateway's CPU seconds a second while it serves nothing (timers, the slice
    watcher's ticks)."""
    start, t0 = cpu_s(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    return (cpu_s(pid) - start) / (time.perf_counter() - t0)


async def _cost(redis_url: str, limits: dict[str, int], requests: int) -> dict[str, Any]:
    """Gateway CPU ms per request of each abusive kind (and, for scale, of the honest
    clients' small chat), sent one at a time: with ``limits`` admitting them all
    (UNLIMITED) or, with the defaults, once the abuser's tokens are spent (every one
    refused); net of what the gateway uses idle meanwhile. CPU time, not wall time: a
    busy machine does not inflate it, so it can be read on a shared one. With each, the
    longest slice its requests held the event loop for (:func:`_watch_slices`)."""
    longest = multiprocessing.get_context("spawn").Array("d", 3, lock=False)
    headers = {"authorization": f"Bearer {ABUSER_KEY}", "content-type": "application/json"}
    result: dict[str, Any] = {}
    with _served(redis_url, limits, longest) as served:
        url, pid = served.url, served.pid
        async with aiohttp.ClientSession() as session:

            async def send(path: str, body: bytes) -> int:
                async with session.post(f"{url}{path}", data=body, headers=headers) as r:
                    await r.read()
                    return r.status

            kinds = {
                **_abuses(),
                "small-chat": ("/v1/chat/completions", json.dumps(REQUEST).encode()),
            }
            for _ in range(3):  # warm-up; with the default limits, spends the tokens
                for path, body in kinds.values():
                    await send(path, body)
            if not limits:
                while await send(*kinds["fenced-1MB"]) != 429:
                    pass
            idle = await _idle_cpu_per_s(pid)
            result["idle_cpu_ms_per_s"] = round(1000 * idle, 2)
            for name, (path, body) in kinds.items():
                start = await _settled_cpu_s(pid, idle)
                t0 = time.perf_counter()
                statuses = Counter([await send(path, body) for _ in range(requests)])
                used = await _settled_cpu_s(pid, idle) - start
                used -= idle * (time.perf_counter() - t0)
                longest[:] = [0.0, 0.0, 1.0]  # the same again, its slices watched
                await asyncio.sleep(0.2)
                for _ in range(requests):
                    await send(path, body)
                await asyncio.sleep(0.2)
                longest[2] = 0.0
                result[name] = {
                    "cpu_ms": round(1000 * used / requests, 2),
                    "longest_loop_slice_cpu_ms": round(longest[0], 2),
                    "longest_loop_slice_wall_ms": round(longest[1], 2),
                    "statuses": dict(statuses),
                }
    return result


async def _costs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "requests_per_kind": args.cpu_per_request,
        "admitted": await _cost(args.redis_url, UNLIMITED, args.cpu_per_request),
        "refused": await _cost(args.redis_url, {}, args.cpu_per_request),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="phases of each condition")
    parser.add_argument(
        "--abuses",
        type=lambda v: tuple(v.split(",")),
        default=ABUSES,
        help=f"comma-separated subset of {','.join(ABUSES)}",
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument(
        "--watch-loop",
        action="store_true",
        help="also report the gateway's longest event-loop slices in each condition (a "
        "1 ms ticker in the gateway: costs it some CPU in both)",
    )
    parser.add_argument(
        "--cpu-per-request",
        type=int,
        metavar="N",
        help="instead: the gateway's CPU ms per abusive request of each kind (N of each, "
        "one at a time), admitted and refused (readable on a busy machine)",
    )
    args = parse(parser, SMOKE)
    result = _run(_costs(args) if args.cpu_per_request else _main(args))
    write_json(args.json, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
