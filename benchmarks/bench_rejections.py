"""What a rejected request costs the gateway: its CPU per 401, 429, 400 and 413.

    python -m benchmarks.bench_rejections --json OUT [--requests 4000] [--clients 4]
                                          [--runs 3] [--kinds wrong_key,...] [--smoke]

Each kind gets a gateway of its own, run as ``draftgate serve`` runs it (uvicorn,
httptools, uvloop) in a child process, with one tenant key and one hosted endpoint that no
rejected request reaches, and its 429s answered at once (``limits.over_limit_hold_s = 0``:
the answer's own cost, not held). A load generator in this process floods it over 127.0.0.1 with
bounded loops: ``--clients`` threads, each sending ``--requests / --clients`` prebuilt
requests (with the headers the openai Python SDK sends) one after another, reading each
answer before the next, on one keep-alive connection (``keep_alive``) and then on a new
connection per request (``new_connection``). Fewer clients cost the gateway more per
request (each request wakes it alone), so ``--clients 1`` gives the figure of a slow flood:

- ``wrong_key``, ``missing_key``: a small chat completion with an unknown key, with none;
- ``wrong_key_get``: ``GET /v1/models`` with an unknown key (a route off the hot path);
- ``over_limit``: a small chat completion of a tenant past its requests a minute;
- ``malformed``: a valid key and a body that is not JSON (the body must be read for this);
- ``too_large``: a valid key and a declared ``Content-Length`` past ``max_body_bytes``,
  the body never sent (new connections only: the connection cannot carry another request).

Reported per kind and mode, over ``--runs`` floods (each run's figure, the median and the
spread): the gateway process's CPU microseconds per rejected request (every thread of it,
read from ``/proc/PID/task/*/schedstat``, net of what it uses idle), the load generator's
own CPU microseconds per request (this process), requests per second, and the statuses
answered. CPU time, not wall time: it can be read on a busy machine, although a quiet one
gives the steadier figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import Served, gateway, parse, write_json

SMOKE = ("--requests", "40", "--clients", "2", "--runs", "1", "--kinds", "wrong_key,over_limit")
KEY_ENV, KEY = "BENCH_TENANT_KEY", "tenant-key-0123456789"
CHAT = json.dumps(
    {"model": "bench", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
).encode()
HOLD_OFF = {"over_limit_hold_s": 0}  # the refusal's own cost: 429s answered at once, not held
OPEN = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, **HOLD_OFF}
LIMITED = {"requests_per_minute": 1, **HOLD_OFF}


# the headers the openai Python SDK sends besides its own (its clients are the usual ones)
SDK_HEADERS = (
    "accept: application/json\r\naccept-encoding: gzip, deflate\r\nconnection: keep-alive\r\n"
    "user-agent: OpenAI/Python 1.99.9\r\nx-stainless-lang: python\r\n"
    "x-stainless-package-version: 1.99.9\r\nx-stainless-os: Linux\r\n"
    "x-stainless-arch: x64\r\nx-stainless-runtime: CPython\r\n"
    "x-stainless-runtime-version: 3.11.7\r\nx-stainless-async: false\r\n"
    "x-stainless-retry-count: 0\r\nx-stainless-read-timeout: 600\r\n"
)


def _post(path: str, body: bytes, key: str | None, length: int | None = None) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\n{SDK_HEADERS}{auth}"
        "content-type: application/json\r\n"
        f"content-length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


KINDS: dict[str, tuple[bytes, dict[str, int]]] = {
    "wrong_key": (_post("/v1/chat/completions", CHAT, "wrong-key-0123456789"), OPEN),
    "missing_key": (_post("/v1/chat/completions", CHAT, None), OPEN),
    "wrong_key_get": (
        f"GET /v1/models HTTP/1.1\r\nhost: 127.0.0.1\r\n{SDK_HEADERS}"
        "authorization: Bearer wrong-key-0123456789\r\n\r\n".encode(),
        OPEN,
    ),
    "over_limit": (_post("/v1/chat/completions", CHAT, KEY), LIMITED),
    "malformed": (_post("/v1/chat/completions", CHAT[:40], KEY), OPEN),
    "too_large": (_post("/v1/chat/completions", b"", KEY, length=10**9), OPEN),
}
HEADERS_ONLY = {"too_large"}  # the answer leaves the connection unusable


def _config(limits: dict[str, int]) -> dict[str, Any]:
    return {
        "endpoints": [
            {
                "name": "nowhere",
                "kind": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "retries": 0,
                "models": ["bench"],
            }
        ],
        "keys": [{"key_env": KEY_ENV, "tenant": "tenant"}],
        "limits": limits,
    }


def server_cpu_s(pid: int) -> float:
    """CPU seconds every thread of process ``pid`` has run (Linux, nanosecond counters)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _answer(sock: socket.socket) -> tuple[int, bool]:
    """One response read whole: its status and whether the server closes the connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the gateway closed the connection without an answer")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    fields = dict(line.split(b": ", 1) for line in lines[1:] if b": " in line)
    left = int(fields.get(b"content-length", b"0")) - len(body)
    while left > 0:
        chunk = sock.recv(left)
        if not chunk:
            break
        left -= len(chunk)
    return int(lines[0].split()[1]), fields.get(b"connection") == b"close"


def _flood(port: int, request: bytes, count: int, keep_alive: bool, seen: Counter[int]) -> None:
    """``count`` requests one after another; their statuses added to ``seen``."""
    statuses: Counter[int] = Counter()
    sock: socket.socket | None = None
    try:
        for _ in range(count):
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            status, closing = _answer(sock)
            statuses[status] += 1
            if closing or not keep_alive:
                sock.close()
                sock = None
    finally:
        if sock is not None:
            sock.close()
        seen.update(statuses)  # Counter.update under the GIL: one call per thread


def _idle_cpu_per_s(pid: int, seconds: float = 1.0) -> float:
    start, t0 = server_cpu_s(pid), time.perf_counter()
    time.sleep(seconds)
    return (server_cpu_s(pid) - start) / (time.perf_counter() - t0)


def _run_flood(
    served: Served, request: bytes, args: argparse.Namespace, keep_alive: bool, idle: float
) -> dict[str, Any]:
    seen: Counter[int] = Counter()
    each = max(1, args.requests // args.clients)
    threads = [
        threading.Thread(target=_flood, args=(served.port, request, each, keep_alive, seen))
        for _ in range(args.clients)
    ]
    server0, client0, t0 = server_cpu_s(served.pid), time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, client = time.perf_counter() - t0, time.process_time() - client0
    time.sleep(0.1)  # the last connections' teardown is the flood's work too
    server = server_cpu_s(served.pid) - server0 - idle * (time.perf_counter() - t0)
    sent = each * args.clients
    return {
        "server_cpu_us": round(1e6 * server / sent, 1),
        "client_cpu_us": round(1e6 * client / sent, 1),
        "requests_per_s": round(sent / wall),
        "statuses": {str(k): v for k, v in sorted(seen.items())},
    }


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    server = [r["server_cpu_us"] for r in runs]
    return {
        "server_cpu_us_per_request": round(statistics.median(server), 1),
        "server_cpu_us_min_max": [min(server), max(server)],
        "client_cpu_us_per_request": round(statistics.median(r["client_cpu_us"] for r in runs), 1),
        "runs": runs,
    }


@contextlib.contextmanager
def _gateway(limits: dict[str, int]) -> Iterator[Served]:
    with gateway(_config(limits), {KEY_ENV: KEY}) as served:
        yield served


def _kind(name: str, args: argparse.Namespace) -> dict[str, Any]:
    request, limits = KINDS[name]
    modes = ("new_connection",) if name in HEADERS_ONLY else ("keep_alive", "new_connection")
    result: dict[str, Any] = {}
    with _gateway(limits) as served:
        seen: Counter[int] = Counter()
        warm = 2 * args.clients  # spends the limit where there is one
        _flood(served.port, request, warm, name not in HEADERS_ONLY, seen)
        idle = _idle_cpu_per_s(served.pid)
        result["server_idle_cpu_ms_per_s"] = round(1000 * idle, 2)
        for mode in modes:
            keep_alive = mode == "keep_alive"
            runs = [_run_flood(served, request, args, keep_alive, idle) for _ in range(args.runs)]
            result[mode] = _spread(runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--requests", type=int, default=4000, help="per flood, all clients")
    parser.add_argument("--clients", type=int, default=4, help="client threads at once")
    parser.add_argument("--runs", type=int, default=3, help="floods of each kind and mode")
    parser.add_argument(
        "--kinds",
        type=lambda v: tuple(v.split(",")),
        default=tuple(KINDS),
        help=f"comma-separated subset of {','.join(KINDS)}",
    )
    args = parse(parser, SMOKE)
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "kinds": {name: _kind(name, args) for name in args.kinds},
    }
    write_json(args.json, result)
    print(json.dumps(result["kinds"], indent=2))


if __name__ == "__main__":
    main()
