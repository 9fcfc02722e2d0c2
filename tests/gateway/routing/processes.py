"""Real ``draftgate verifier`` / ``draftgate serve`` processes on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]
START_DEADLINE_S = 1800.0  # loading the model on a busy shared 2-core machine took 10+ minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """One ``draftgate`` command on ``port``; ``ready`` says when it may take requests."""

    def __init__(
        self,
        args: list[str],
        port: int,
        ready: Callable[[httpx.Response], bool],
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = args
        self.env = env or {}
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._ready = ready
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        """Start it and wait until it is ready."""
        return self.spawn().wait()

    def spawn(self) -> Process:
        """Start it (not waiting)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from gateway.cli import main; main()", *self.args],
            cwd=ROOT,
            env={**os.environ, **self.env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return self

    def wait(self) -> Process:
        """Poll its ``/healthz`` until it is ready (fails if it exits or runs out of time)."""
        assert self.proc is not None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args[0]} on port {self.port} exited at start")
            try:
                if self._ready(httpx.get(f"{self.url}/healthz", timeout=2)):
                    return self
            except httpx.HTTPError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.2)  # a poll interval that ends early if it dies
        raise RuntimeError(f"{self.args[0]} on port {self.port} not ready in time")

    def kill(self) -> None:
        """SIGKILL: the process vanishes mid-request, as a crashed replica does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def verifier(model: str, port: int | None = None) -> Process:
    """``draftgate verifier --model MODEL`` (ready once the model is loaded)."""
    port = port or free_port()
    args = ["verifier", "--model", model, "--port", str(port)]
    return Process(args, port, lambda r: r.json().get("local", {}).get("local") == "loaded")


def gateway(config: Path, env: dict[str, str]) -> Process:
    """``draftgate serve --config FILE`` with ``env`` added (ready once it answers)."""
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port)]
    return Process(args, port, lambda r: r.status_code == 200, env)
