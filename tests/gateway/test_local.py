"""The local endpoint on the real SmolLM2-135M model, through the real ``openai`` client."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "smollm2-135m"
CODE = "def add(a, b):\n    return a + b\n"
MESSAGES = [{"role": "user", "content": f"Repeat this code exactly:\n{CODE}"}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_chat_with_prediction_reports_usage(local_url: str) -> None:
    raw = client(local_url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=12,
        prediction={"type": "content", "content": CODE},
    )
    answer = raw.parse()
    assert raw.headers["x-draftgate-prediction"] == "verified-locally"
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    usage = answer.usage
    assert usage.completion_tokens <= 12 and usage.prompt_tokens > 0
    details = usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0


async def test_stream_matches_non_stream_and_plain_decoding(local_url: str) -> None:
    """Greedy output: streamed == not streamed == drafting switched off (lossless)."""
    async with openai.AsyncOpenAI(base_url=f"{local_url}/v1", api_key="x", max_retries=0) as c:
        common: dict[str, Any] = {
            "model": MODEL,
            "messages": MESSAGES,
            "temperature": 0,
            "max_tokens": 12,
        }
        whole = await c.chat.completions.create(**common)
        stream = await c.chat.completions.create(
            **common, stream=True, stream_options={"include_usage": True}
        )
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        plain = await c.chat.completions.create(
            **common, extra_body={"draftgate": {"draft": False}}
        )
    assert "".join(pieces) == whole.choices[0].message.content == plain.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


QUESTIONS = [
    f"Repeat this code exactly:\n{CODE}",
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "def fib(n):",
]


async def _stream_text(c: openai.AsyncOpenAI, content: str, **extra: Any) -> str:
    stream = await c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=24,
        stream=True,
        **extra,
    )
    return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 7}])
async def test_four_concurrent_streams_equal_sequential_answers(
    local_url: str, sampling: dict[str, Any]
) -> None:
    """Batched answers (4 streams at once, drafts on) equal one-at-a-time answers without
    drafts, greedy and seeded sampling alike."""
    async with openai.AsyncOpenAI(base_url=f"{local_url}/v1", api_key="x", max_retries=0) as c:
        alone = [
            await _stream_text(c, q, **sampling, extra_body={"draftgate": {"draft": False}})
            for q in QUESTIONS
        ]
        together = await asyncio.gather(*(_stream_text(c, q, **sampling) for q in QUESTIONS))
    assert list(together) == alone
    assert all(alone)


def test_completions_api(local_url: str) -> None:
    answer = client(local_url).completions.create(
        model=MODEL, prompt="def add(a, b):", temperature=0, max_tokens=6
    )
    assert answer.object == "text_completion"
    assert answer.usage.completion_tokens <= 6


def test_prompt_too_long_is_400(local_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 9000}], max_tokens=4
        )
    assert err.value.code == "context_length_exceeded"


def test_unsupported_parameter_is_400(local_url: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, audio={"voice": "alloy", "format": "wav"}
        )
    assert err.value.param == "audio"


def test_documents_feed_local_drafting(local_url: str) -> None:
    httpx.post(f"{local_url}/v1/documents", json={"id": "add.py", "text": CODE}).raise_for_status()
    raw = client(local_url).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=8,
        extra_body={"draftgate": {"documents": ["add.py"]}},
    )
    assert raw.headers["x-draftgate-prediction"] == "verified-locally"
    assert raw.parse().usage.completion_tokens > 0


def test_client_disconnect_stops_generation(local_url: str, local_app: Any) -> None:
    local = local_app.state.runtime.local["local"]
    engine = local._engine
    assert engine.wait_idle(60)  # earlier tests' generations have ended
    stopped = local.stopped
    story = [{"role": "user", "content": "Write a very long story about a dragon."}]
    body = {
        "model": MODEL,
        "messages": story,
        "temperature": 0,
        "max_tokens": 4000,
        "stream": True,
        "draftgate": {"draft": False},
    }
    with (
        httpx.Client(timeout=60) as c,
        c.stream("POST", f"{local_url}/v1/chat/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if '"content"' in line and '"content":""' not in line:
                break
    # the request must end long before 4000 tokens could be generated, its blocks freed
    assert engine.wait_idle(10)
    assert local.stopped == stopped + 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("guided_json", {"type": "object"}),
        ("echo", True),
    ],
)
def test_fields_the_engine_cannot_honour_are_400(local_url: str, field: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={field: value}
        )
    assert (err.value.param, err.value.code) == (field, "unsupported_parameter")


def test_harmless_fields_are_accepted(local_url: str) -> None:
    answer = client(local_url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, user="u1", extra_body={"store": False}
    )
    assert answer.choices[0].message.content is not None


@pytest.mark.parametrize("stream", [False, True])
def test_engine_failures_reach_the_log_not_the_client(
    local_url: str, local_app: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any, stream: bool
) -> None:
    """A failure inside the engine (injected: the real one does not fail on demand)."""
    engine = local_app.state.runtime.local["local"]._engine

    from local_verifier.events import END, Failed

    class Finished:
        def cancel(self) -> None:
            pass

    def fail(request: Any, n: int, on_item: Any) -> Finished:
        on_item(0, Failed(RuntimeError("CUDA error at /srv/models/secret-weights.bin")))
        on_item(0, END)
        return Finished()

    monkeypatch.setattr(engine, "submit_n", fail)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "stream": stream}
    with caplog.at_level("ERROR", logger="gateway.endpoints.local.endpoint"):
        r = httpx.post(f"{local_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 502
    assert "secret" not in r.text and "RuntimeError" not in r.text
    assert r.json()["error"]["message"] == "local generation failed"
    assert "secret-weights" in caplog.text


def test_a_full_engine_refuses_before_any_document_work(
    local_url: str, local_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every place of the engine taken, a request naming documents in a long prompt is
    a 503 with Retry-After at once: the store is not touched for it."""
    runtime = local_app.state.runtime
    engine = runtime.local["local"]._engine
    monkeypatch.setattr(type(engine), "full", property(lambda self: True))
    names = " ".join(f"src/m{i}.py" for i in range(20_000))
    crowded = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Use {names}"}],
        "max_tokens": 4,
        "draftgate": {"documents": ["a.py"]},
    }
    trips = runtime.corpus.store.round_trips
    refused = httpx.post(f"{local_url}/v1/chat/completions", json=crowded, timeout=60)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "service_unavailable"
    assert refused.headers["retry-after"] == "1"
    assert runtime.corpus.store.round_trips == trips

    assert engine.pool.used() == 0


def test_a_repeated_prompt_reports_cached_tokens_and_metrics(local_url: str) -> None:
    long_messages = [{"role": "user", "content": f"Repeat this code exactly:\n{CODE * 6}"}]
    answers = [
        client(local_url).chat.completions.create(
            model=MODEL, messages=long_messages, temperature=0, max_tokens=4
        )
        for _ in range(2)
    ]
    assert answers[1].choices[0].message.content == answers[0].choices[0].message.content
    assert answers[1].usage.prompt_tokens_details.cached_tokens >= 64
    metrics = httpx.get(f"{local_url}/metrics").text
    assert 'draftgate_prefix_cache_hit_tokens_total{endpoint="local"}' in metrics
    assert 'draftgate_local_memory_bytes{endpoint="local",part="kv_reserved_bytes"}' in metrics
    assert 'part="kv_in_use_bytes"' in metrics
