"""What the benchmarks share: ports, servers in child processes, percentiles, CPU seconds,
the workload, the machine's facts, transformers in a process of its own, the JSON written,
the loops' progress.

Benchmarks run from the repository root as modules (``python -m benchmarks.bench_serving``);
the package is not part of the wheel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import socket
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

from gateway.audit.workload import WorkloadItem, load_workload
from gateway.progress import Task, progress, track
from gateway.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "default.jsonl"
"""The workload this project ships (``benchmarks/workloads/build.py`` makes it)."""
MODEL = "smollm2-135m"
"""The embedded default model, served under this name."""
SIMD_FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")
T = TypeVar("T")
SPAWN = multiprocessing.get_context("spawn")  # a child without this process's threads


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile the audit reports (``gateway.stats``)."""
    value = percentile(values, q)
    if value is None:
        raise ValueError("no samples")
    return value


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine has spent busy since boot (Linux)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """The facts a figure depends on: CPU model, SIMD flags, cores, Python."""
    info: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    flags = info.get("flags", "").split()
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "simd_flags": sorted(f for f in flags if f.startswith(SIMD_FLAG_PREFIXES)),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def workload(
    path: str | Path | None = None, categories: Sequence[str] = (), limit: int | None = None
) -> list[WorkloadItem]:
    """The workload's items (the shipped one by default) of ``categories`` (all when
    empty); at most ``limit``, taken from the categories in turn so a short run stays mixed."""
    items = load_workload(path or WORKLOAD)
    if categories:
        items = [i for i in items if i.category in categories]
    if limit is None or limit >= len(items):
        return items
    queues: dict[str, list[WorkloadItem]] = {}
    for item in items:
        queues.setdefault(item.category, []).append(item)
    picked: list[WorkloadItem] = []
    while len(picked) < limit:
        for queue in queues.values():
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return picked


def stdlib_slices(chars: int, count: int) -> list[str]:
    """``count`` consecutive ``chars``-character slices of the stdlib ``*.py`` text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    out: list[str] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out += [text[i : i + chars] for i in range(0, len(text) - chars // 2, chars)]
        if len(out) >= count:
            return out[:count]
    raise RuntimeError(f"the stdlib holds only {len(out)} slices of {chars} characters")


def write_json(path: str | Path, result: Mapping[str, Any]) -> None:
    """``result`` as indented JSON at ``path``, with the ``machine`` it ran on."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "machine": machine()}, indent=2) + "\n")


def _titled(description: str) -> str:
    return f"{Path(sys.argv[0]).stem}: {description}"  # the benchmark's module name


def steps(items: Iterable[T], description: str, *, total: int | None = None) -> Iterator[T]:
    """Each of ``items``, the loop's progress on stderr (a live bar on a terminal, plain
    lines otherwise): stdout and the JSON written hold the results alone."""
    return track(items, _titled(description), total=total)


def counted(description: str, total: int | None) -> contextlib.AbstractContextManager[Task]:
    """A progress task on stderr for work :func:`steps` cannot wrap (requests answered by
    concurrent workers): ``advance()`` it after each."""
    return progress(_titled(description), total)


@contextlib.contextmanager
def spawned(target: Callable[..., None], *args: Any) -> Iterator[BaseProcess]:
    """``target(*args)`` in a spawned child process, terminated on the way out."""
    proc = SPAWN.Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        proc.terminate()
        proc.join(10)


def wait_port(port: int, proc: BaseProcess, deadline_s: float = 300) -> None:
    """Until 127.0.0.1:``port`` accepts a connection (uvicorn listens once the app's
    start-up has run); raises when ``proc`` exits or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not proc.is_alive():
            raise RuntimeError(f"the server for port {port} exited ({proc.exitcode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        proc.join(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {deadline_s} s")


@dataclass(frozen=True)
class Served:
    """A server in a child process."""

    url: str
    port: int
    process: BaseProcess

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid


def _serve_asgi(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="error", access_log=False, lifespan="off"
    )


@contextlib.contextmanager
def asgi_server(app: Any) -> Iterator[Served]:
    """A module-level ASGI ``app`` (a stand-in upstream) served by uvicorn in a child."""
    port = free_port()
    with spawned(_serve_asgi, app, port) as proc:
        wait_port(port, proc)
        yield Served(f"http://127.0.0.1:{port}", port, proc)


def _serve_gateway(
    config: dict[str, Any],
    port: int,
    environ: dict[str, str],
    wrap: Callable[[Any], Any] | None,
    log_level: str,
) -> None:
    from gateway.app import create_app
    from gateway.cli.serve import run_server
    from gateway.config import build_settings

    settings = build_settings(config, "benchmark")
    app = create_app(settings, environ=environ)
    run_server(
        wrap(app) if wrap else app, "127.0.0.1", port, server=settings.server, log_level=log_level
    )


@contextlib.contextmanager
def gateway(
    config: dict[str, Any],
    environ: Mapping[str, str] | None = None,
    wrap: Callable[[Any], Any] | None = None,
    log_level: str = "error",
) -> Iterator[Served]:
    """The gateway as ``draftgate serve`` runs it on ``config`` (the TOML's mapping), in a
    child process; ``environ`` is what it reads key variables from, ``wrap`` (picklable)
    wraps its ASGI app."""
    port = free_port()
    args = (config, port, dict(environ or {}), wrap, log_level)
    with spawned(_serve_gateway, *args) as proc:
        wait_port(port, proc)
        yield Served(f"http://127.0.0.1:{port}", port, proc)


def local_endpoint(**options: Any) -> dict[str, Any]:
    """The config of a gateway with one local endpoint on the embedded default, no auth."""
    endpoint = {"name": "local", "kind": "local", "model": MODEL, "models": [MODEL]}
    return {"endpoints": [endpoint | options], "auth": False}


class _FirstToken:
    """A ``generate`` streamer that notes when the first new token came (transformers puts
    the prompt first, then each new token)."""

    def __init__(self) -> None:
        self.puts = 0
        self.at: float | None = None

    def put(self, value: Any) -> None:
        self.puts += 1
        if self.puts == 2:
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def _peer(conn: Connection, reference_args: tuple[Any, ...]) -> None:
    import torch

    from local_verifier.testing.reference import load_reference

    model = load_reference(*reference_args)
    conn.send("ready")
    while (call := conn.recv()) is not None:
        name, ids, kwargs = call
        inputs = torch.tensor([ids])
        first = _FirstToken() if name == "generate_timed" else None
        with torch.inference_mode():
            begin = time.perf_counter()
            if name == "forward":
                model(inputs)
                new: list[int] = []
            else:
                mask = torch.ones_like(inputs)
                out = model.generate(inputs, attention_mask=mask, streamer=first, **kwargs)
                new = out[0, len(ids) :].tolist()
            wall = time.perf_counter() - begin
        first_s = None if first is None or first.at is None else first.at - begin
        conn.send((new, wall, first_s))


class TransformersPeer:
    """transformers' model (``load_reference(*reference_args)``) in a process of its own.

    A user's engine does not share its process with transformers: thread pools, OpenMP
    teams and the allocator are per process. transformers run on the main thread leaves it
    an OpenMP team; beside the engine thread's, the runtime has more threads than CPUs and
    the engine's threads wait for a wake-up at each parallel region instead of spinning.
    Here each side's figures are its own; calls are one at a time (the peer waits while the
    engine runs) and each is timed inside the peer."""

    def __init__(self, *reference_args: Any) -> None:
        self._conn, child = SPAWN.Pipe()
        self._proc = SPAWN.Process(target=_peer, args=(child, reference_args), daemon=True)
        self._proc.start()
        if self._conn.recv() != "ready":
            raise RuntimeError("the transformers peer did not start")

    def generate(self, ids: Sequence[int], **kwargs: Any) -> tuple[list[int], float]:
        """``model.generate``'s new token ids (the prompt's ones cut) and its seconds."""
        self._conn.send(("generate", list(ids), kwargs))
        new, wall, _ = self._conn.recv()
        return new, wall

    def generate_timed(self, ids: Sequence[int], **kwargs: Any) -> tuple[list[int], float, float]:
        """As :meth:`generate`, with the seconds to the first new token (the prompt pass)."""
        self._conn.send(("generate_timed", list(ids), kwargs))
        new, wall, first_s = self._conn.recv()
        return new, wall, first_s

    def forward_s(self, ids: Sequence[int]) -> float:
        """Seconds of one forward pass over ``ids`` (prompt processing)."""
        self._conn.send(("forward", list(ids), {}))
        return float(self._conn.recv()[1])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()

    def __enter__(self) -> TransformersPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse(
    parser: argparse.ArgumentParser, smoke: Sequence[str], argv: Sequence[str] | None = None
) -> argparse.Namespace:
    """The command line; ``--smoke`` stands for ``smoke``, the options of a seconds-long run
    (CI runs it so a broken benchmark fails there), and options given beside it win."""
    parser.add_argument("--smoke", action="store_true", help="seconds: " + " ".join(smoke))
    args = list(sys.argv[1:] if argv is None else argv)
    return parser.parse_args([*smoke, *args] if "--smoke" in args else args)
