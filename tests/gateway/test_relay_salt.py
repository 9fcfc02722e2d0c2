"""A vLLM or SGLang engine's prefix cache through the relay: every relayed request carries
its tenant's ``cache_salt`` (stable per tenant, different between tenants; a verify
endpoint's passthrough uses remote verification's salt), and the engine's cached-token
counts never reach the caller, in a JSON answer or a stream. The engine is the OpenAI-wire
stand-in, whose one cache ignores the salt (as an engine without salting would) and
reports a prompt seen before as cached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from gateway.endpoints.hosted.cache_report import scrub_events
from gateway.endpoints.remote.selftest import SelfTest
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

KEYS = {"KEY_ALICE": "alice-key", "KEY_BOB": "bob-key"}


def _endpoint(name: str, kind: str, url: str, **extra: Any) -> dict[str, Any]:
    model = {"name": f"{name}-model", "upstream": "gpt-4o-mini"}
    return {"name": name, "kind": kind, "base_url": f"{url}/v1", "models": [model], **extra}


@pytest.fixture(scope="module")
def gateway(standin_server: tuple[StandIn, str]) -> Iterator[tuple[Any, str]]:
    """Behind one gateway: a vLLM endpoint, an SGLang endpoint with remote verification
    (its self-test's verdict set to exact: the stand-in speaks no scoring API) and an
    OpenAI endpoint, all on the stand-in."""
    url = standin_server[1]
    verify = {
        "verify": "remote",
        "tokenizer": "smollm2-135m",
        "verify_check_interval_s": 0,
        "retries": 0,
    }
    settings = build_settings(
        {
            "endpoints": [
                _endpoint("vllm", "vllm", url),
                _endpoint("sglang", "sglang", url, **verify),
                _endpoint("openai", "openai", url),
            ],
            "keys": [
                {"key_env": "KEY_ALICE", "tenant": "alice"},
                {"key_env": "KEY_BOB", "tenant": "bob"},
            ],
        },
        "test",
    )
    app = create_app(settings, environ=KEYS)
    with serve(app) as gateway_url:
        (remote,) = app.state.runtime.remote.values()
        assert remote.checked.wait(120)
        remote.self_test = SelfTest("exact", 1.0, 1, True, "set by the test")
        yield app, gateway_url


def _client(url: str, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=f"{tenant}-key", max_retries=0)


def _cached(usage: Any) -> int | None:
    details = usage.prompt_tokens_details
    return None if details is None else details.cached_tokens


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_each_tenant_has_its_own_salt_and_hears_of_no_cached_tokens(
    gateway: tuple[Any, str], standin: StandIn, name: str
) -> None:
    app, url = gateway
    messages: Any = [{"role": "user", "content": f"A prompt all tenants send to {name}."}]
    seen = []
    for tenant in ("alice", "bob", "alice"):
        raw = _client(url, tenant).chat.completions.with_raw_response.create(
            model=f"{name}-model", messages=messages, temperature=0.7
        )
        if name == "sglang":  # passed through remote verification to the relay
            assert raw.headers["x-draftgate-remote-verify"] == "passthrough:sampled"
        answer = raw.parse()
        assert answer.choices[0].message.content and answer.usage is not None
        assert _cached(answer.usage) is None  # the stand-in counted the repeats as cached
        seen.append(standin.requests[-1].body["cache_salt"])
    alice, bob, alice_again = seen
    assert alice == alice_again != bob
    assert len(alice) == 43
    if name == "sglang":  # the tenant's salt is remote verification's own
        (remote,) = app.state.runtime.remote.values()
        assert alice == remote.salts("alice")


def test_a_streams_usage_chunk_has_no_cached_tokens(
    gateway: tuple[Any, str], standin: StandIn
) -> None:
    messages: Any = [{"role": "user", "content": "A streamed prompt, sent twice."}]
    client = _client(gateway[1], "bob")
    for _ in range(2):
        stream = client.chat.completions.create(
            model="vllm-model",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        (usage,) = [c.usage for c in chunks if c.usage is not None]
        assert usage.prompt_tokens > 0 and _cached(usage) is None
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert standin.requests[0].body["cache_salt"] == standin.requests[1].body["cache_salt"]


def test_other_kinds_relay_the_upstreams_cached_tokens(
    gateway: tuple[Any, str], standin: StandIn
) -> None:
    """The control: the stand-in does report the repeat as cached, and a hosted provider's
    answer (its cache is its own business) reaches the caller as it came, unsalted."""
    messages: Any = [{"role": "user", "content": "A prompt sent twice to a provider."}]
    client = _client(gateway[1], "alice")
    for _ in range(2):
        answer = client.chat.completions.create(model="openai-model", messages=messages)
    assert answer.usage is not None and _cached(answer.usage) == answer.usage.prompt_tokens > 0
    assert "cache_salt" not in standin.requests[-1].body


def test_stream_events_keep_every_byte_but_the_counts() -> None:
    untouched = b'data: {"choices":[{"delta":{"content":"cached_tokens"}}]}\r\n\r\n'
    usage = b'data: {"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}'
    ready = untouched + usage + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    assert scrub_events(ready) == (
        untouched
        + b'data: {"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}'
        + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    )
