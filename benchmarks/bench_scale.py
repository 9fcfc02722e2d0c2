"""Scale-out: one vs two ``draftgate verifier`` replicas behind the gateway, and ``prefix``
vs ``least-busy`` routing on multi-turn sessions.

    python -m benchmarks.bench_scale --json OUT [--max-batch 4] [--concurrency 12]
        [--warmup-s 10] [--window-s 45] [--sessions 8] [--turns 4] [--rounds 3]
        [--sessions-only | --throughput-only] [--smoke]

Two verifier processes (SmolLM2-135M, greedy) are started, each pinned to one CPU core
(``os.sched_setaffinity`` in the child, and one torch/OpenMP thread) and each running at
most ``--max-batch`` requests at once (``draftgate verifier --max-batch``; more wait in
its queue). The gateway is a ``draftgate serve`` process started per configuration; it and
the load client (this process) are not pinned: on a 2-core machine they share the
replicas' cores, and each run reports how much CPU they took.

Throughput is capacity: a closed loop of ``--concurrency`` workers (default three times
``--max-batch``) sending chats of ``--max-tokens`` tokens on average (each request's limit
is spread from half to one and a half times that, the same per request index in every
configuration, so that requests admitted together do not finish together), non-streamed
(the figure is work served, not how it arrives), through a gateway with replica ``a``
only, then with ``a`` and ``b`` (``least-busy``), interleaved for ``--rounds`` rounds. The
engine batches continuously and a step over more rows yields more tokens per second, so a
load that fits in one replica's batch would compare a batch of 4 against two batches of
2, not one replica's capacity against two. With at least twice ``--max-batch`` workers
both configurations run full batches all the time: one replica runs ``max_batch``
requests and queues the rest, two run ``max_batch`` each (the 50% margin covers the
client's round trip between a request's end and the next). Requests completed within a
``--window-s`` window after ``--warmup-s`` count; those still running at its end are
cancelled. Per configuration: completion tokens/s (the headline) and requests/s, e2e
p50/p99, requests per replica, each replica's share of its core (its CPU seconds over the
window), tokens per replica CPU second, the gateway's and the client's CPU milliseconds
per request, the cores other processes on the machine took meanwhile and the load
average; the summary gives the 2-vs-1 tokens/s ratio per round and its median.

Sessions: ``--sessions`` conversations run at once, each ``--turns`` streamed turns in
order (a turn's messages carry the earlier turns), with a random pause of 0 to 2x
``--think-s`` seconds between turns (the user reading; without it a closed loop keeps
each session on the endpoint that just freed up, which flatters ``least-busy``). A turn
after the first is a warm hit when the replica that answers it (``X-Draftgate-Endpoint``)
already answered an earlier turn of the session, i.e. holds its prefix. Warm-hit rate and
TTFT per strategy, interleaved likewise.

``--smoke`` runs for seconds (one request at a time per replica, 3-second windows). The defaults took 10 minutes on a 2-core
machine beside one other job and 18 beside several (the summary's ``elapsed_s``).
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
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import MODEL, ROOT, cpu_s, free_port, machine_busy_s, parse, write_json
from gateway.stats import percentile

SMOKE = (
    *("--max-batch", "1", "--max-tokens", "2", "--warmup-s", "1", "--window-s", "3"),
    *("--sessions", "2", "--turns", "2", "--session-max-tokens", "2", "--think-s", "0"),
    *("--rounds", "1"),
)
SYSTEM = "You are a careful assistant. Answer briefly."
TOPICS = ["rivers", "volcanoes", "bridges", "owls", "tides", "glaciers", "comets", "maples"]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gateway.cli import main; main()", *args]


def _start_verifier(port: int, core: int, max_batch: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen(
        _command("verifier", "--model", MODEL, "--port", str(port), "--max-batch", str(max_batch)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def _wait_ready(url: str, proc: subprocess.Popen[bytes], loaded: bool, deadline_s: float) -> None:
    """Poll ``/healthz`` until it answers (``loaded``: until its local model is loaded)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the process serving {url} exited")
        try:
            r = httpx.get(f"{url}/healthz", timeout=2)
            if r.status_code == 200 and (not loaded or r.json()["local"]["local"] == "loaded"):
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    raise SystemExit(f"{url} was not ready in time")


def _config(urls: dict[str, str], strategy: str) -> str:
    endpoints = "".join(
        f'[[endpoints]]\nname = "{name}"\nkind = "local"\nbase_url = "{url}/v1"\n'
        f'models = ["{MODEL}"]\n\n'
        for name, url in urls.items()
    )
    return f'{endpoints}[routing]\nstrategy = "{strategy}"\nhealth_check_interval_s = 0\n'


@contextlib.contextmanager
def _gateway(urls: dict[str, str], strategy: str, port: int) -> Iterator[tuple[str, int]]:
    """A ``draftgate serve`` process in front of ``urls``: its URL and pid."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "draftgate.toml"
        config.write_text(_config(urls, strategy))
        proc = subprocess.Popen(
            _command("serve", "--config", str(config), "--port", str(port)),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc, loaded=False, deadline_s=300)
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=30)


class _Meter:
    """CPU seconds of the replicas, the gateway, this process and the whole machine."""

    def __init__(self, replicas: dict[str, int], gateway: int) -> None:
        self.replicas = replicas
        self.gateway = gateway

    def read(self) -> dict[str, float]:
        return {
            **{name: cpu_s(pid) for name, pid in self.replicas.items()},
            "gateway": cpu_s(self.gateway),
            "client": time.process_time(),
            "machine": machine_busy_s(),
        }


def _length(i: int, mean: int) -> int:
    """Request ``i``'s ``max_tokens``: spread over ``mean/2 .. 3*mean/2`` so that requests
    admitted together do not all finish together (completions would come in batches)."""
    return max(1, mean // 2 + (i * 7) % (mean + 1))


async def _throughput(
    url: str, meter: _Meter, concurrency: int, max_tokens: int, warmup_s: float, window_s: float
) -> dict[str, Any]:
    """Closed loop of ``concurrency`` workers; what completed within the window after
    ``warmup_s`` counts, and the CPU every party used over that window. The requests still
    running at its end are cancelled (their clients go away, as the gateway handles)."""
    done: list[tuple[float, float, str, int]] = []  # (end, e2e, endpoint, completion tokens)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker(i: int) -> None:
            while True:
                body = {
                    "model": MODEL,
                    "messages": [
                        {"role": "user", "content": f"Tell me about {TOPICS[i % 8]} ({i})."}
                    ],
                    "max_tokens": _length(i, max_tokens),
                    "temperature": 0,
                }
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body)
                r.raise_for_status()
                end = time.perf_counter()
                tokens = r.json()["usage"]["completion_tokens"]
                done.append((end, end - t0, r.headers["x-draftgate-endpoint"], tokens))
                i += concurrency

        workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
        await asyncio.sleep(warmup_s)
        cpu0, t0 = meter.read(), time.perf_counter()
        await asyncio.sleep(window_s)
        cpu1, t1 = meter.read(), time.perf_counter()
        for task in workers:
            task.cancel()
        for failed in await asyncio.gather(*workers, return_exceptions=True):
            if not isinstance(failed, asyncio.CancelledError):
                raise RuntimeError(f"a request failed: {failed!r}")
    counted = [d for d in done if t0 <= d[0] < t1]
    wall = t1 - t0
    used = {k: cpu1[k] - cpu0[k] for k in cpu0}
    n = max(len(counted), 1)
    served: dict[str, int] = {}
    for _, _, name, _ in counted:
        served[name] = served.get(name, 0) + 1
    replica_cpu = sum(used[name] for name in meter.replicas)
    ours = replica_cpu + used["gateway"] + used["client"]
    return {
        "requests": len(counted),
        "requests_per_s": len(counted) / wall,
        "tokens_per_s": sum(d[3] for d in counted) / wall,
        "tokens_per_request": sum(d[3] for d in counted) / n,
        "e2e_p50_s": percentile([d[1] for d in counted], 50),
        "e2e_p99_s": percentile([d[1] for d in counted], 99),
        "served": served,
        "replica_core_share": {name: used[name] / wall for name in meter.replicas},
        "replica_cores": replica_cpu / wall,
        "tokens_per_replica_cpu_s": sum(d[3] for d in counted) / replica_cpu,
        "gateway_cpu_ms_per_request": 1000 * used["gateway"] / n,
        "client_cpu_ms_per_request": 1000 * used["client"] / n,
        "other_processes_cores": (used["machine"] - ours) / wall,
        "load_average_1m": os.getloadavg()[0],
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
        "ttft_p50_s": percentile(ttft_all, 50),
        "ttft_p50_warm_s": percentile(ttft_warm, 50) if ttft_warm else None,
        "ttft_p50_cold_s": percentile(ttft_cold, 50) if ttft_cold else None,
    }


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _summary(
    runs: dict[str, list[dict[str, Any]]],
    cores: list[int],
    args: argparse.Namespace,
    started: float,
) -> dict[str, Any]:
    """Medians over the rounds so far, written to ``--json`` (after every configuration, so
    a run cut short still leaves its figures)."""
    one, two = runs.get("one", []), runs.get("two", [])
    ratios = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(one, two, strict=False)]
    per_cpu = [
        b["tokens_per_replica_cpu_s"] / a["tokens_per_replica_cpu_s"]
        for a, b in zip(one, two, strict=False)
    ]
    keys = (
        "requests_per_s",
        "tokens_per_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "replica_cores",
        "tokens_per_replica_cpu_s",
        "gateway_cpu_ms_per_request",
        "client_cpu_ms_per_request",
        "other_processes_cores",
    )
    out = {
        "placement": f"{os.cpu_count()} CPUs (shared), replicas pinned to cores {cores[:2]}",
        "offered_load": (
            f"closed loop, {args.concurrency} workers, chats of {args.max_tokens} tokens; "
            f"each replica runs at most {args.max_batch} at once"
        ),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "rounds_done": max(len(v) for v in runs.values()) if runs else 0,
        "elapsed_s": time.monotonic() - started,  # replicas' loading included
        "throughput": {
            label: {k: _median(runs.get(label, []), k) for k in keys} for label in ("one", "two")
        },
        "two_vs_one": statistics.median(ratios) if ratios else None,
        "two_vs_one_by_round": ratios,
        # tokens per replica CPU second, two replicas over one: 1.0 = the same work per
        # core second, so a ratio short of 2 comes from the cores the replicas did not get
        "two_vs_one_per_replica_cpu_s": statistics.median(per_cpu) if per_cpu else None,
        "sessions": {
            s: {
                k: _median(runs.get(s, []), k)
                for k in ("warm_hit_rate", "ttft_p50_s", "ttft_p50_warm_s")
            }
            for s in ("least-busy", "prefix")
        },
        "runs": runs,
    }
    write_json(args.json, out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--max-batch", type=int, default=4, help="each replica's running cap")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="closed-loop workers (3 x --max-batch)"
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=45.0, help="completions counted")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--session-max-tokens", type=int, default=8)
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between turns")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--sessions-only", action="store_true", help="skip the 1-vs-2 runs")
    only.add_argument("--throughput-only", action="store_true", help="skip the sessions")
    args = parse(parser, SMOKE)
    args.concurrency = args.concurrency or 3 * args.max_batch
    if args.concurrency < 2 * args.max_batch:
        parser.error("--concurrency must be at least 2 x --max-batch to fill two replicas")

    started = time.monotonic()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two CPU cores to pin two replicas")
    ports = {"a": free_port(), "b": free_port()}
    gateway_port = free_port()
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    procs = {
        name: _start_verifier(ports[name], cores[i], args.max_batch) for i, name in enumerate(ports)
    }
    runs: dict[str, list[dict[str, Any]]] = {}

    def record(label: str, result: dict[str, Any]) -> None:
        runs.setdefault(label, []).append(result)
        print(label, json.dumps(result), flush=True)
        _summary(runs, cores, args, started)

    try:
        for name, proc in procs.items():
            _wait_ready(urls[name], proc, loaded=True, deadline_s=900)
        throughput = () if args.sessions_only else (("one", ["a"]), ("two", ["a", "b"]))
        strategies = () if args.throughput_only else ("least-busy", "prefix")
        for _ in range(args.rounds):
            for label, names in throughput:
                replicas = {name: urls[name] for name in names}
                with _gateway(replicas, "least-busy", gateway_port) as (url, pid):
                    meter = _Meter({name: procs[name].pid for name in names}, pid)
                    work = _throughput(
                        url, meter, args.concurrency, args.max_tokens, args.warmup_s, args.window_s
                    )
                    record(label, asyncio.run(work))
            for strategy in strategies:
                with _gateway(urls, strategy, gateway_port) as (url, _):
                    work = _sessions(
                        url, args.sessions, args.turns, args.session_max_tokens, args.think_s
                    )
                    record(strategy, asyncio.run(work))
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)

    summary = _summary(runs, cores, args, started)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))


if __name__ == "__main__":
    main()
