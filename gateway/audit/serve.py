"""Serve an ASGI app with uvicorn on a free loopback port in a background thread, so an
audit measures real streaming HTTP."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def serve_in_thread(app: Any, *, timeout_s: float = 300.0) -> Iterator[str]:
    """Yields the base URL ``http://127.0.0.1:PORT`` while ``app`` is served."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = _Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])),
        daemon=True,
        name="draftgate-serve",
    )
    thread.start()
    try:
        for _ in range(int(timeout_s * 10)):
            if server.ready.wait(0.1):
                break
            if not thread.is_alive():
                raise RuntimeError("the gateway failed to start")
        else:
            raise RuntimeError("the gateway did not start in time")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
