"""``draftgate serve`` as a process: slow clients cannot hold a connection forever."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.openai_standin import StandIn

CONFIG = """
[[endpoints]]
name = "openai"
kind = "openai"
base_url = "{url}/v1"
models = ["gpt-4o-mini"]

[server]
header_timeout_s = 0.5
body_timeout_s = 0.5
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(
    standin_server: tuple[StandIn, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """The port of ``draftgate serve`` on the stand-in with 0.5 s header/body deadlines."""
    config = tmp_path_factory.mktemp("serve") / "draftgate.toml"
    config.write_text(CONFIG.format(url=standin_server[1]))
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gateway.cli import main; main()",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):  # readiness: poll until it answers (or has died)
            if proc.poll() is not None:
                pytest.fail("draftgate serve exited")
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=20)


def test_trickled_headers_are_cut_off(served: int) -> None:
    with _connect(served) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert sock.recv(1024) == b""  # the server closes it (the 20 s timeout would raise)


def test_a_slow_body_gets_a_408(served: int) -> None:
    with _connect(served) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
        )
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
            if b"request_timeout" in answer:
                break
        assert answer.startswith(b"HTTP/1.1 408")


def test_a_prompt_client_is_served(served: int) -> None:
    assert httpx.get(f"http://127.0.0.1:{served}/healthz").status_code == 200
