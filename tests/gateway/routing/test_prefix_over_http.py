"""``prefix`` routing over HTTP: two endpoints (both on the OpenAI stand-in); a session's
turns, or chats with one opening, keep one endpoint; different openings use both."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn


@pytest.fixture
def gateway(standin_server: tuple[StandIn, str]) -> Iterator[str]:
    base = f"{standin_server[1]}/v1"
    settings = build_settings(
        {
            "endpoints": [
                {"name": name, "kind": "vllm", "base_url": base, "models": ["m"]}
                for name in ("s1", "s2")
            ],
            "routing": {"strategy": "prefix", "health_check_interval_s": 0},
        }
    )
    with serve(create_app(settings, environ={})) as url:
        yield url


def _served(url: str, messages: list[dict[str, str]], session: str | None = None) -> str:
    headers = {"x-draftgate-session": session} if session else {}
    body = {"model": "m", "messages": messages, "max_tokens": 4}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-draftgate-endpoint"]


def test_turns_of_a_conversation_stay_and_conversations_spread(gateway: str) -> None:
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "util.py"}]
    homes = set()
    for i in range(6):
        homes.add(_served(gateway, turns))
        turns += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"q{i}"}]
    assert len(homes) == 1
    openings = {_served(gateway, [{"role": "user", "content": f"file{i}.py"}]) for i in range(20)}
    assert openings == {"s1", "s2"}


def test_a_session_header_overrides_the_prompt(gateway: str) -> None:
    served = {_served(gateway, [{"role": "user", "content": f"q{i}"}], "sess-7") for i in range(8)}
    assert len(served) == 1
