"""The local endpoint's prefix cache is per tenant unless ``share_prefix_cache``: a tenant
cannot learn from ``cached_tokens`` that another tenant sent a prompt."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve

pytestmark = pytest.mark.timeout(600)

ENVIRON = {"KEY_A": "tenant-a-key-0123456789", "KEY_B": "tenant-b-key-0123456789"}


def _cached_tokens(url: str, key: str, content: str) -> int:
    body = {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 2,
    }
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=300,
    )
    answer.raise_for_status()
    return int(answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def _rendered(engine: Any, content: str) -> str:
    messages = [{"role": "user", "content": content}]
    return str(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


@pytest.mark.parametrize("shared", [False, True])
def test_one_tenant_s_prompt_is_cached_for_another_only_when_shared(
    engine: Any, shared: bool
) -> None:
    endpoint = {"name": "local", "kind": "local", "model": "smollm2-135m"}
    settings = build_settings(
        {
            "endpoints": [{**endpoint, "models": ["smollm2-135m"], "share_prefix_cache": shared}],
            "keys": [
                {"key_env": "KEY_A", "tenant": "a"},
                {"key_env": "KEY_B", "tenant": "b"},
            ],
        },
        "test",
    )
    app = create_app(settings, environ=ENVIRON, engines={"local": engine})
    # a prompt no other test sent: whatever the shared engine cached, this is new
    prompt = f"Secret {secrets.token_hex(8)}: " + "the quick brown fox jumps. " * 40
    # the chat template's own opening, the same in every prompt, may be cached from other
    # tests when the cache is shared; nothing from the secret on can be
    header = len(engine.tokenizer.encode(_rendered(engine, prompt).split("Secret ")[0]))
    with serve(app) as url:
        first = _cached_tokens(url, ENVIRON["KEY_A"], prompt)
        assert first <= header if shared else first == 0
        assert _cached_tokens(url, ENVIRON["KEY_A"], prompt) >= header + 64  # its own: cached
        seen_by_b = _cached_tokens(url, ENVIRON["KEY_B"], prompt)
    assert (seen_by_b >= header + 64) if shared else seen_by_b == 0
