"""Gateway fixtures: the stand-in upstream and a gateway in front of it, both real
uvicorn servers on loopback ports; the local model is shared per session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.app import create_app
from gateway.config import Settings, build_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

UPSTREAM_KEY = "sk-upstream-secret-0123456789"
KEYS = {
    "DRAFTGATE_KEY_ALICE": "alice-key",
    "DRAFTGATE_KEY_BOB": "bob-key",
    "DRAFTGATE_KEY_OPS": "ops-key",
}
ENVIRON = {"STANDIN_KEY": UPSTREAM_KEY, **KEYS}


@pytest.fixture(scope="session")
def standin_server() -> Iterator[tuple[StandIn, str]]:
    standin = StandIn()
    with serve(standin) as url:
        yield standin, url


@pytest.fixture
def standin(standin_server: tuple[StandIn, str]) -> StandIn:
    standin_server[0].reset()
    return standin_server[0]


def standin_settings(url: str, **extra: Any) -> Settings:
    """Endpoints on the stand-in: an OpenAI-kind, a vLLM-kind, an Azure-kind, a dead one."""
    fast = {"backoff_s": 0.01, "max_backoff_s": 0.05, "retries": 2}
    data: dict[str, Any] = {
        "endpoints": [
            {
                "name": "dead",
                "kind": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "retries": 0,
                "models": [{"name": "failover", "upstream": "gpt-4o-mini"}],
            },
            {
                "name": "openai",
                "kind": "openai",
                "base_url": f"{url}/v1",
                "api_key_env": "STANDIN_KEY",
                "timeout_s": 5.0,
                **fast,
                "models": [
                    {"name": "gpt-4o-mini", "aliases": ["mini"]},
                    {"name": "failover", "upstream": "gpt-4o-mini"},
                    {"name": "rate-limited", "upstream": "rate-limited-once"},
                    "always-429",
                    {"name": "flaky", "upstream": "unavailable-once"},
                    "always-500",
                    "bad-request",
                    "leaky-401",
                    "stream-cut",
                    "slow-stream",
                ],
            },
            {
                "name": "slow",
                "kind": "openai",
                "base_url": f"{url}/v1",
                "timeout_s": 0.3,
                "retries": 0,
                "models": [{"name": "slow-headers"}],
            },
            {
                "name": "vllm",
                "kind": "vllm",
                "base_url": f"{url}/v1",
                "models": [{"name": "llama", "upstream": "ignores-prediction"}],
            },
            {
                "name": "azure",
                "kind": "azure",
                "base_url": url,
                "api_key_env": "STANDIN_KEY",
                "api_version": "2025-01-01-preview",
                "models": [{"name": "azure-gpt-4o", "upstream": "gpt-4o"}],
            },
        ],
        "keys": [
            {"key_env": "DRAFTGATE_KEY_ALICE", "tenant": "alice"},
            {"key_env": "DRAFTGATE_KEY_BOB", "tenant": "bob"},
            {"key_env": "DRAFTGATE_KEY_OPS", "tenant": "ops", "admin": True},
        ],
        **extra,
        # the door's 429s held briefly: the timer runs, tests do not wait out the default
        "limits": {"over_limit_hold_s": 0.01, **extra.get("limits", {})},
    }
    return build_settings(data, "test")


@pytest.fixture(scope="session")
def gateway_url(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    """The gateway in front of the stand-in (keys: alice-key, bob-key; ops-key is an admin)."""
    app = create_app(standin_settings(standin_server[1]), environ=ENVIRON)
    with serve(app) as url:
        yield url


@pytest.fixture(scope="session")
def local_app(engine: Any) -> Any:
    """The verifier configuration (one local endpoint, no auth) on the shared engine."""
    from gateway.cli.serve import verifier_settings

    return create_app(verifier_settings("smollm2-135m"), engines={"local": engine})


@pytest.fixture(scope="session")
def local_url(local_app: Any) -> Iterator[str]:
    with serve(local_app) as url:
        yield url
