"""Suite-wide fixtures: a real Redis server, one key prefix per test."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_redis_skip_reason: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except Exception:
        return False


def _wait_until_answers(url: str, proc: subprocess.Popen[bytes]) -> bool:
    """Poll PING until the server answers (a readiness check, not a sleep)."""
    import redis

    client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
    for _ in range(200):
        if proc.poll() is not None:
            return False
        try:
            if client.ping():
                return True
        except Exception:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
    return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``REDIS_URL`` if set, else a ``redis-server`` started on a free port for the run."""
    env = os.environ.get("REDIS_URL")
    if env:
        if not _answers(env):
            pytest.fail(f"REDIS_URL={env} is set but no Redis answers there")
        yield env
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no REDIS_URL and no redis-server binary: Redis tests skipped")
    port = _free_port()
    workdir = tempfile.mkdtemp(prefix="draftgate-redis-")
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        if not _wait_until_answers(url, proc):
            pytest.skip(f"redis-server did not start on port {port}: Redis tests skipped")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own, so tests never see each other's keys."""
    return f"dgtest:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client(redis_url: str, redis_prefix: str) -> Iterator[object]:
    """A sync client; deletes the test's keys afterwards."""
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    for key in client.scan_iter(match=f"*{redis_prefix}*"):
        client.delete(key)
    client.close()


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """The real SmolLM2-135M-Instruct GGUF (``local_verifier.LoadedModel``), fp32 on CPU,
    context cut to 4096 tokens; loaded once for the whole run."""
    from local_verifier.loader import load_model

    return load_model("smollm2-135m", device="cpu", dtype="float32", max_seq_len=4096)


@pytest.fixture(scope="session")
def engine(smollm2: Any) -> Any:
    """The real SmolLM2 generation engine on the shared model, shared by every package's tests."""
    from local_verifier.engine import Engine

    return Engine(smollm2, max_draft=16)


WORKLOAD = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads" / "default.jsonl"


@pytest.fixture(scope="session")
def workload_path() -> Path:
    """The project's benchmark workload (``benchmarks/workloads/default.jsonl``)."""
    return WORKLOAD
