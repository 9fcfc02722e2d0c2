"""Corpus-wide retrieval on the local endpoint (real SmolLM2-135M): a question asked again
after other requests drafts from its captured earlier answer, and the response says so."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import build_settings
from lookup.corpus import Corpus, open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

QUESTIONS = [
    "Write a Python function that returns the factorial of n.",
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many days are in a leap year?",
    "What does HTTP stand for?",
]


async def test_a_repeated_question_drafts_from_its_earlier_answer(engine: Any) -> None:
    endpoint = {"name": "local", "kind": "local", "model": "smollm2-135m", "models": ["m"]}
    settings = build_settings({"endpoints": [endpoint], "auth": False, "capture": True})
    corpus = Corpus(open_store(None))
    app = create_app(settings, corpus=corpus, engines={"local": engine})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=600
    ) as c:

        async def ask(question: str) -> dict[str, Any]:
            r = await c.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": question}],
                    "temperature": 0,
                    "max_tokens": 64,
                },
            )
            assert r.status_code == 200, r.text
            await corpus.drain()  # the capture of this answer has landed
            return r.json()  # type: ignore[no-any-return]

        first = await ask(QUESTIONS[0])
        for question in QUESTIONS[1:]:
            await ask(question)
        again = await ask(QUESTIONS[0])
    text = first["choices"][0]["message"]["content"]
    assert again["choices"][0]["message"]["content"] == text
    by_source = again["draftgate"]["accepted_by_source"]
    assert sum(by_source.values()) == again["draftgate"]["accepted_tokens"]
    completion = again["usage"]["completion_tokens"]
    # recent = 2 no longer reaches it: it was found by content; all but a few tokens of the
    # answer (the first, and each verify step's own token) were drafted from it
    assert by_source.get("answer", 0) >= completion - again["draftgate"]["verify_steps"] - 1
    assert by_source.get("answer", 0) > completion // 2
    assert first["draftgate"]["accepted_by_source"].get("answer", 0) == 0
