"""A local endpoint whose model cannot be loaded: requests get a 503, the log says why, and
the gateway keeps serving."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.app import create_app
from gateway.config import build_settings


async def test_a_model_too_big_for_memory_is_a_503_and_a_log_line(caplog: Any) -> None:
    """A K/V cache no machine holds: refused before anything is allocated, the figures in
    the log, none in the response."""
    endpoint = {
        "name": "local",
        "kind": "local",
        "model": "smollm2-135m",
        "models": ["smollm2-135m"],
        "kv_cache_mb": 2**40,
    }
    app = create_app(build_settings({"endpoints": [endpoint], "auth": False}, "test"))
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}]}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        with caplog.at_level("ERROR", logger="gateway.endpoints.local.endpoint"):
            r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 503
        assert "could not load its model" in r.json()["error"]["message"]
        assert "GiB" not in r.text
        assert "ModelLoadError: the model needs" in caplog.text
        assert "GiB available" in caplog.text
        assert (await c.get("/v1/models")).status_code == 200
