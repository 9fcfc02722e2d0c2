"""``/v1/models``, ``/healthz``, ``/metrics``, and single-tenant mode."""

from __future__ import annotations

import httpx
import openai

from gateway.app import create_app
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn


def test_models_lists_names_and_aliases(gateway_url: str) -> None:
    c = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="bob-key", max_retries=0)
    ids = [m.id for m in c.models.list()]
    assert {"gpt-4o-mini", "mini", "failover", "llama", "azure-gpt-4o"} <= set(ids)


def test_healthz_and_metrics(gateway_url: str, standin: StandIn) -> None:
    r = httpx.get(f"{gateway_url}/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert "x-draftgate-overhead-ms" in r.headers
    openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="alice-key").chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    )
    assert httpx.get(f"{gateway_url}/metrics").status_code == 401  # every tenant's traffic
    alice = httpx.get(f"{gateway_url}/metrics", headers={"authorization": "Bearer alice-key"})
    assert alice.status_code == 403
    metrics = httpx.get(f"{gateway_url}/metrics", headers={"authorization": "Bearer ops-key"})
    assert metrics.status_code == 200
    e2e = 'draftgate_e2e_seconds_count{endpoint="openai",model="gpt-4o-mini"}'
    counts = [float(line.split()[-1]) for line in metrics.text.splitlines() if line.startswith(e2e)]
    assert counts and counts[0] >= 1  # the request's timing reached telemetry


def test_no_keys_means_one_tenant_and_no_check(standin_server: tuple[StandIn, str]) -> None:
    settings = standin_settings(standin_server[1], keys=[])
    app = create_app(settings, environ={"STANDIN_KEY": "sk-test-abcdefgh"})
    with serve(app) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="anything", max_retries=0)
        answer = c.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
        )
        assert answer.choices[0].message.content
        httpx.post(f"{url}/v1/documents", json={"id": "d", "text": "t"}).raise_for_status()
        assert (
            httpx.get(f"{url}/v1/documents/d", headers={"authorization": "Bearer other"}).json()[
                "text"
            ]
            == "t"
        )


def test_metrics_public_opens_traffic_figures(standin_server: tuple[StandIn, str]) -> None:
    settings = standin_settings(standin_server[1], metrics_public=True)
    app = create_app(settings, environ=ENVIRON)
    with serve(app) as url:
        assert httpx.get(f"{url}/metrics").status_code == 200
        alice = {"authorization": "Bearer alice-key"}
        assert httpx.get(f"{url}/v1/endpoints", headers=alice, timeout=30).status_code == 200
        assert httpx.get(f"{url}/v1/endpoints").status_code == 401  # still a tenant's key
