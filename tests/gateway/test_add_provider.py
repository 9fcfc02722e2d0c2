"""Adding a provider is one row of ``gateway.provider_table`` (CONTRIBUTING.md): a new
kind, added there alone, is configured, reached at its URL with its credential headers,
has its capability applied to predictions and answers the real openai client; the
upstream is the OpenAI-wire stand-in behind an httpx transport. Every kind of the table
has its documented record."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from gateway.provider_table import OPENAI_CONFLICTS, PROVIDERS, Capability, Provider
from gateway.records.table import load_table
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

ACME = Provider(
    Capability(True, OPENAI_CONFLICTS, ("acme-",)),
    hosted=True,
    base_url="https://api.acme.test/v1",
    key_header=b"x-acme-key",
    key_prefix=b"",
    headers=((b"acme-version", b"7"),),
)
MESSAGES: Any = [{"role": "user", "content": "Rename x to y in: x = 1"}]
PREDICTION: Any = {"type": "content", "content": "y = 1"}


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[openai.OpenAI, StandIn]]:
    """A gateway with one endpoint of the new kind, the client in front, the upstream behind."""
    monkeypatch.setitem(PROVIDERS, "acme", ACME)
    settings = build_settings(
        {
            "endpoints": [
                {
                    "name": "acme",
                    "kind": "acme",
                    "api_key_env": "ACME_KEY",
                    "models": [{"name": "big", "upstream": "acme-large"}],
                }
            ]
        }
    )
    upstream = StandIn()
    app = create_app(
        settings, environ={"ACME_KEY": "acme-secret"}, transport=httpx.ASGITransport(app=upstream)
    )
    with serve(app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0), upstream


def test_a_new_row_is_a_provider_end_to_end(acme: tuple[openai.OpenAI, StandIn]) -> None:
    client, upstream = acme
    raw = client.chat.completions.with_raw_response.create(
        model="big", messages=MESSAGES, prediction=PREDICTION, temperature=0
    )
    answer = raw.parse()
    assert raw.headers["x-draftgate-endpoint"] == "acme"
    assert raw.headers["x-draftgate-prediction"] == "passed"  # its capability: acme-* take it
    (seen,) = upstream.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["x-acme-key"] == "acme-secret" and seen.headers["acme-version"] == "7"
    assert "authorization" not in seen.headers
    assert seen.body["model"] == "acme-large" and seen.body["prediction"] == PREDICTION
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0


def test_a_new_rows_stream_and_capability(acme: tuple[openai.OpenAI, StandIn]) -> None:
    client, upstream = acme
    stream = client.chat.completions.create(
        model="big", messages=MESSAGES, stream=True, temperature=0
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    raw = client.chat.completions.with_raw_response.create(
        model="big", messages=MESSAGES, prediction=PREDICTION, n=2
    )
    # a conflict of its capability: the prediction is dropped before the provider sees it
    assert raw.headers["x-draftgate-prediction"] == "dropped:n"
    assert "prediction" not in upstream.requests[-1].body


def test_every_kind_has_its_documented_record() -> None:
    documented = {kind for row in load_table() for kind in row.kinds}
    assert set(PROVIDERS) <= documented


def test_azure_puts_chat_under_the_deployment_and_responses_beside_it() -> None:
    class Target:
        deployment = "prod-4o"
        api_version = "2025-04-01-preview"

    url = PROVIDERS["azure"].url
    base = "https://acme.openai.azure.com"
    assert url(base, "chat/completions", "gpt-4o", Target()) == (
        f"{base}/openai/deployments/prod-4o/chat/completions?api-version=2025-04-01-preview"
    )
    assert url(base, "responses", "gpt-4o", Target()) == (
        f"{base}/openai/responses?api-version=2025-04-01-preview"
    )
