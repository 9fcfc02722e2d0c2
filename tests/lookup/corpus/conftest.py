"""Corpus fixtures: the same tests run on the in-memory store, one Redis, and a Redis Cluster."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from lookup.corpus import Corpus, DocumentStore, open_store


class FakeClock:
    """Wall-clock seconds that only move when a test says so."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def free_port(bus: bool = False) -> int:
    """A free loopback port (and, with ``bus``, port + 10000 free too, for a cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not bus:
            return port
        if port + 10000 > 65535:
            port -= 20000
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 10000):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair found")


class RedisServer:
    """A ``redis-server`` of a test's own, which the test may stop and start again."""

    def __init__(self, port: int, workdir: Path, *extra: str) -> None:
        self.port = port
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server binary not found")
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.workdir), *self.extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        for _ in range(400):
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server on port {self.port} exited")
            try:
                if client.ping():
                    client.close()
                    return
            except redis.RedisError:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.05)
        pytest.fail(f"redis-server on port {self.port} did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis server on a free port, stopped after the test."""
    server = RedisServer(free_port(), tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


CLUSTER_READY_S = 60.0


def _cluster_ready(clients: list[redis.Redis]) -> bool:
    """Every node reports state ok and sees all three slot ranges."""
    return all(c.cluster("info")["cluster_state"] == "ok" for c in clients) and all(
        len(c.cluster("slots")) == 3 for c in clients
    )


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A real three-node Redis Cluster (no replicas) on loopback, for the session."""
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server binary: cluster tests skipped")
    workdir = Path(tempfile.mkdtemp(prefix="draftgate-cluster-"))
    nodes: list[RedisServer] = []
    try:
        for i in range(3):
            node = RedisServer(
                free_port(bus=True),
                workdir / str(i),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            )
            node.start()
            nodes.append(node)
        create = ["redis-cli", "--cluster", "create"]
        create += [f"127.0.0.1:{n.port}" for n in nodes]
        create += ["--cluster-replicas", "0", "--cluster-yes"]
        subprocess.run(create, check=True, capture_output=True, timeout=60)
        clients = [redis.Redis(port=n.port, socket_timeout=1) for n in nodes]
        # gossip takes a moment (seconds on a busy machine): poll against a deadline
        deadline = time.monotonic() + CLUSTER_READY_S
        while not _cluster_ready(clients):
            if time.monotonic() > deadline:
                pytest.fail(f"Redis Cluster did not reach state ok in {CLUSTER_READY_S:.0f} s")
            assert nodes[0].proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                nodes[0].proc.wait(timeout=0.05)  # also returns at once if the node died
        for c in clients:
            c.close()
        yield f"redis+cluster://127.0.0.1:{nodes[0].port}"
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


BACKENDS = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("cluster", marks=pytest.mark.redis),
]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[DocumentStore]:
    """Each backend in turn; Redis stores get a key prefix of their own."""
    if request.param == "memory":
        s = open_store(None)
    elif request.param == "redis":
        request.getfixturevalue("redis_client")  # deletes this test's keys afterwards
        s = open_store(
            request.getfixturevalue("redis_url"),
            prefix=request.getfixturevalue("redis_prefix"),
            timeout_s=2.0,
        )
    else:
        s = open_store(
            request.getfixturevalue("redis_cluster_url"),
            prefix=request.getfixturevalue("redis_prefix"),
            timeout_s=2.0,
        )
    yield s
    await s.aclose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def corpus(store: DocumentStore, clock: FakeClock) -> Corpus:
    return Corpus(store, clock=clock)
