"""Capture: answers (and request code blocks) land in the tenant's namespace after the
response, only when switched on."""

from __future__ import annotations

import httpx
import pytest

from gateway.app import create_app
from lookup.corpus import Corpus, open_store
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.openai_standin import StandIn

ANSWER = "The function is fine as it is: it returns one."
PROMPT = "Fix this:\n```python\ndef f():\n    return 1\n```\n"


@pytest.mark.parametrize("capture", [True, False])
async def test_capture_after_response(
    standin_server: tuple[StandIn, str], standin: StandIn, capture: bool
) -> None:
    standin.script.reply = lambda body: ANSWER  # an answer apart from the prompt's code
    corpus = Corpus(open_store(None))
    app = create_app(
        standin_settings(standin_server[1], capture=capture), environ=ENVIRON, corpus=corpus
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gw",
        headers={"authorization": "Bearer alice-key"},
    ) as c:
        for stream in (False, True):
            r = await c.post(
                "/v1/chat/completions",
                json={
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": PROMPT}],
                    "stream": stream,
                },
            )
            assert r.status_code == 200
    await corpus.drain()
    texts = [(await corpus.get("alice", d.id)).text for d in await corpus.list("alice")]  # type: ignore[union-attr]
    if capture:
        assert ANSWER in texts
        assert any("def f():" in t for t in texts)
    else:
        assert texts == []
    assert await corpus.list("bob") == []
