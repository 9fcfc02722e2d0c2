"""Two ``draftgate serve`` processes sharing one Redis: in front of the two verifier
replicas, a document uploaded through one drafts requests on the other and the
speculation records (traffic roll-ups) of both are one; a tenant's rate limits are one
budget whichever gateway counts a request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.routing.conftest import MODEL
from tests.gateway.routing.processes import Process, free_port, gateway

KEY = {"authorization": "Bearer scale-test-key"}
CHAT = {"model": MODEL, "max_tokens": 4, "temperature": 0}


@pytest.fixture
def gateways(
    replicas: dict[str, Process], redis_url: str, redis_prefix: str, tmp_path: Path
) -> Iterator[list[str]]:
    endpoints = "\n".join(
        f'[[endpoints]]\nname = "{name}"\nkind = "local"\nbase_url = "{p.url}/v1"\n'
        f'models = ["{MODEL}"]\n'
        for name, p in replicas.items()
    )
    config = tmp_path / "draftgate.toml"
    config.write_text(
        f"{endpoints}\n"
        '[[keys]]\nkey_env = "SCALE_TEST_KEY"\ntenant = "alice"\nadmin = true\n\n'
        f'[redis]\nurl = "{redis_url}"\nprefix = "{redis_prefix}"\n'
    )
    env = {"SCALE_TEST_KEY": "scale-test-key", "REDIS_URL": redis_url}
    procs = [gateway(config, env), gateway(config, env)]
    try:
        for p in procs:
            p.spawn()
        for p in procs:
            p.wait()
        yield [p.url for p in procs]
    finally:
        for p in procs:
            p.stop()


@pytest.fixture
def limited_gateways(redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two gateways allowing 3 requests a minute per tenant; their one endpoint is a port
    nothing listens on (a refused request never reaches it)."""
    config = tmp_path / "draftgate.toml"
    config.write_text(
        f'[[endpoints]]\nname = "gone"\nkind = "local"\n'
        f'base_url = "http://127.0.0.1:{free_port()}/v1"\nmodels = ["{MODEL}"]\n\n'
        '[[keys]]\nkey_env = "SCALE_TEST_KEY"\ntenant = "alice"\n\n'
        '[[keys]]\nkey_env = "SCALE_TEST_BOB"\ntenant = "bob"\n\n'
        "[limits]\nrequests_per_minute = 3\n\n"
        f'[redis]\nurl = "{redis_url}"\nprefix = "{redis_prefix}"\n'
    )
    env = {"SCALE_TEST_KEY": "scale-test-key", "SCALE_TEST_BOB": "scale-test-bob"}
    procs = [gateway(config, {**env, "REDIS_URL": redis_url}) for _ in range(2)]
    try:
        for p in procs:
            p.spawn()
        for p in procs:
            p.wait()
        yield [p.url for p in procs]
    finally:
        for p in procs:
            p.stop()


def _served(records: list[dict[str, object]]) -> int:
    return sum(int(r["latency"]["requests"]) for r in records if r["latency"])  # type: ignore[index]


@pytest.mark.redis
@pytest.mark.usefixtures("redis_client")  # removes the test's keys afterwards
def test_two_gateways_share_documents_and_records(gateways: list[str]) -> None:
    one, two = gateways
    text = "def area(r):\n    return 3.14159 * r * r\n"
    r = httpx.post(f"{one}/v1/documents", json={"id": "geo.py", "text": text}, headers=KEY)
    assert r.status_code in (200, 201), r.text
    got = httpx.get(f"{two}/v1/documents/geo.py", headers=KEY)
    assert got.status_code == 200 and got.json()["text"] == text

    # the other gateway drafts from it in the request path
    r = httpx.post(
        f"{two}/v1/chat/completions",
        json={**CHAT, "messages": [{"role": "user", "content": "Repeat geo.py."}]},
        headers={**KEY, "x-draftgate-documents": "geo.py"},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-draftgate-prediction"] == "synthesized"

    for _ in range(2):
        r = httpx.post(
            f"{one}/v1/chat/completions",
            json={**CHAT, "messages": [{"role": "user", "content": "Hi"}]},
            headers=KEY,
            timeout=300,
        )
        assert r.status_code == 200, r.text
    # listing the records writes the listing gateway's pending roll-ups first
    httpx.get(f"{two}/v1/endpoints", headers=KEY, timeout=30).raise_for_status()
    assert _served(httpx.get(f"{one}/v1/endpoints", headers=KEY, timeout=30).json()["data"]) == 3
    assert _served(httpx.get(f"{two}/v1/endpoints", headers=KEY, timeout=30).json()["data"]) == 3


@pytest.mark.redis
@pytest.mark.usefixtures("redis_client")  # removes the test's keys afterwards
def test_two_gateways_share_rate_limits(limited_gateways: list[str]) -> None:
    one, two = limited_gateways
    for _ in range(3):
        assert httpx.get(f"{one}/v1/documents", headers=KEY, timeout=30).status_code == 200
    # the other gateway refuses what the first already counted, a listing and a completion
    refused = [
        httpx.get(f"{two}/v1/documents", headers=KEY, timeout=30),
        httpx.post(
            f"{two}/v1/chat/completions",
            json={**CHAT, "messages": [{"role": "user", "content": "Hi"}]},
            headers=KEY,
            timeout=30,
        ),
    ]
    for r in refused:
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(r.headers["retry-after"]) <= 60
    # another tenant's budget is its own
    bob = {"authorization": "Bearer scale-test-bob"}
    assert httpx.get(f"{two}/v1/documents", headers=bob, timeout=30).status_code == 200
