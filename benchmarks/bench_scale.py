"""Scale-out: one vs two ``draftgate verifier`` replicas behind the gateway, and ``prefix``
vs ``least-busy`` routing on multi-turn sessions.

    python benchmarks/bench_scale.py --json OUT [--requests 32] [--concurrency 4]
        [--sessions 8] [--turns 4] [--rounds 3] [--sessions-only]

The defaults are sized for an idle 2-core machine, estimated (not measured) from the
idle step times in RESULTS.md: loading the two replicas takes seconds and a round about a
minute, so a whole run should take 3-5 minutes, well under 8 (the summary's
``elapsed_s`` says how long it took). Smoke run: ``--requests 2 --concurrency 2 --max-tokens 2 --sessions 2 --turns 2
--session-max-tokens 2 --think-s 0 --rounds 1``.

Two verifier processes (SmolLM2-135M, greedy) are started, each pinned to one CPU core
(``os.sched_setaffinity`` in the child, and one torch/OpenMP thread), so two replicas
have twice the cores of one. The gateway and the load client run in this process on
whatever cores are free (they are light next to the model).

Throughput: the same closed-loop load (``--concurrency`` workers, ``--requests`` chats
of ``--max-tokens`` tokens) through a gateway with replica ``a`` only, then with ``a``
and ``b`` (``least-busy``), interleaved for ``--rounds`` rounds; requests/s and e2e
p50/p99 per configuration and the 2-vs-1 throughput ratio.

Sessions: ``--sessions`` conversations run at once, each ``--turns`` streamed turns in
order (a turn's messages carry the earlier turns), with a random pause of 0 to 2x
``--think-s`` seconds between turns (the user reading; without it a closed loop keeps
each session on the endpoint that just freed up, which flatters ``least-busy``). A turn after the first is a warm hit
when the replica that answers it (``X-Draftgate-Endpoint``) already answered an earlier
turn of the session, i.e. holds its prefix. Warm-hit rate and TTFT per strategy,
interleaved likewise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.app import create_app  # noqa: E402
from gateway.audit.serve import serve_in_thread  # noqa: E402
from gateway.config import build_settings  # noqa: E402

MODEL = "smollm2-135m"
SYSTEM = "You are a careful assistant. Answer briefly."
TOPICS = ["rivers", "volcanoes", "bridges", "owls", "tides", "glaciers", "comets", "maples"]


def _start_verifier(port: int, core: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", "from gateway.cli import main; main()", "verifier"]
        + ["--model", MODEL, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def _wait_loaded(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 900) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"verifier at {url} exited")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).json()["local"]["local"] == "loaded":
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    raise SystemExit(f"verifier at {url} did not load in time")


def _settings(urls: dict[str, str], strategy: str) -> Any:
    endpoints = [
        {"name": name, "kind": "local", "base_url": f"{url}/v1", "models": [MODEL]}
        for name, url in urls.items()
    ]
    return build_settings(
        {"endpoints": endpoints, "routing": {"strategy": strategy, "health_check_interval_s": 0}}
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _throughput(url: str, requests: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    latencies: list[float] = []
    served: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                topic = TOPICS[i % len(TOPICS)]
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"Tell me about {topic} ({i})."}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                name = r.headers["x-draftgate-endpoint"]
                served[name] = served.get(name, 0) + 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {
        "requests_per_s": requests / wall,
        "e2e_p50_s": _pct(latencies, 0.5),
        "e2e_p99_s": _pct(latencies, 0.99),
        "served": served,
    }


async def _sessions(
    url: str, sessions: int, turns: int, max_tokens: int, think_s: float
) -> dict[str, Any]:
    hits = warm_turns = 0
    ttft_all: list[float] = []
    ttft_warm: list[float] = []
    ttft_cold: list[float] = []
    run = f"{time.time_ns()}"  # new openings every run: no replica holds them yet
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def session(s: int) -> None:
            nonlocal hits, warm_turns
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"[{run}-{s}] Tell me about {TOPICS[s % 8]}."},
            ]
            seen: set[str] = set()
            for turn in range(turns):
                body = {
                    "model": MODEL,
                    "messages": messages,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "stream": True,
                }
                t0 = time.perf_counter()
                ttft = None
                text = []
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    endpoint = r.headers["x-draftgate-endpoint"]
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                        if delta:
                            ttft = ttft if ttft is not None else time.perf_counter() - t0
                            text.append(delta)
                if ttft is not None:
                    ttft_all.append(ttft)
                if turn > 0:
                    warm_turns += 1
                    warm = endpoint in seen
                    hits += warm
                    if ttft is not None:
                        (ttft_warm if warm else ttft_cold).append(ttft)
                seen.add(endpoint)
                messages += [
                    {"role": "assistant", "content": "".join(text)},
                    {"role": "user", "content": f"Tell me more ({turn + 1})."},
                ]
                await asyncio.sleep(random.uniform(0, 2 * think_s))

        await asyncio.gather(*(session(s) for s in range(sessions)))
    return {
        "warm_hit_rate": hits / warm_turns if warm_turns else 0.0,
        "warm_turns": warm_turns,
        "ttft_p50_s": _pct(ttft_all, 0.5),
        "ttft_p50_warm_s": _pct(ttft_warm, 0.5) if ttft_warm else None,
        "ttft_p50_cold_s": _pct(ttft_cold, 0.5) if ttft_cold else None,
    }


def _through_gateway(urls: dict[str, str], strategy: str, work: Any) -> dict[str, Any]:
    app = create_app(_settings(urls, strategy), environ={})
    with serve_in_thread(app) as gateway_url:
        return asyncio.run(work(gateway_url))  # type: ignore[no-any-return]


def _summary(
    runs: dict[str, list[dict[str, Any]]],
    cores: list[int],
    args: argparse.Namespace,
    started: float,
) -> dict[str, Any]:
    """Medians over the rounds so far, written to ``--json`` (after every configuration, so
    a run cut short still leaves its figures)."""

    def median(label: str, key: str) -> float | None:
        values = [r[key] for r in runs.get(label, []) if r[key] is not None]
        return statistics.median(values) if values else None

    one, two = median("one", "requests_per_s"), median("two", "requests_per_s")
    out = {
        "machine": f"{os.cpu_count()} CPUs (shared), replicas pinned to cores {cores[:2]}",
        "args": vars(args) | {"json": str(args.json)},
        "rounds_done": len(runs.get("prefix", [])),
        "elapsed_s": time.monotonic() - started,  # replicas' loading included
        "throughput": {
            label: {k: median(label, k) for k in ("requests_per_s", "e2e_p50_s", "e2e_p99_s")}
            for label in ("one", "two")
        },
        "two_vs_one": two / one if one and two else None,
        "sessions": {
            s: {k: median(s, k) for k in ("warm_hit_rate", "ttft_p50_s", "ttft_p50_warm_s")}
            for s in ("least-busy", "prefix")
        },
        "runs": runs,
    }
    args.json.write_text(json.dumps(out, indent=2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--requests", type=int, default=32, help="chats per throughput run")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop workers")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--session-max-tokens", type=int, default=8)
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between turns")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--base-port", type=int, default=18311)
    parser.add_argument("--sessions-only", action="store_true", help="skip the 1-vs-2 runs")
    args = parser.parse_args()

    started = time.monotonic()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two CPU cores to pin two replicas")
    ports = {"a": args.base_port, "b": args.base_port + 1}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs = {name: _start_verifier(ports[name], cores[i]) for i, name in enumerate(ports)}
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, proc in procs.items():
            _wait_loaded(urls[name], proc)
        throughput = () if args.sessions_only else (("one", {"a": urls["a"]}), ("two", urls))
        for _ in range(args.rounds):
            for label, replicas in throughput:
                result = _through_gateway(
                    replicas,
                    "least-busy",
                    lambda u: _throughput(u, args.requests, args.concurrency, args.max_tokens),
                )
                runs.setdefault(label, []).append(result)
                print(label, json.dumps(result), flush=True)
                _summary(runs, cores, args, started)
            for strategy in ("least-busy", "prefix"):
                result = _through_gateway(
                    urls,
                    strategy,
                    lambda u: _sessions(
                        u, args.sessions, args.turns, args.session_max_tokens, args.think_s
                    ),
                )
                runs.setdefault(strategy, []).append(result)
                print(strategy, json.dumps(result), flush=True)
                _summary(runs, cores, args, started)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)

    print(
        json.dumps({k: v for k, v in _summary(runs, cores, args, started).items() if k != "runs"})
    )


if __name__ == "__main__":
    main()
