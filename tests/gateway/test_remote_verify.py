"""Remote verification against a stand-in SGLang/vLLM server backed by the real SmolLM2
engine: the verified text is the engine's own greedy decoding, the stream and usage are
right, sampled requests pass through, and failed round trips recover or end cleanly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.audit.client import RequestRecord
from gateway.audit.metrics import group_stats
from gateway.config import build_settings
from gateway.endpoints.remote.endpoint import RemoteEndpoint
from gateway.endpoints.remote.verify import Pacing, judge
from lookup.corpus import Corpus, open_store
from tests.gateway.servers import serve
from tests.remote_standin import RemoteStandIn

KINDS = {"sg": "sglang", "vl": "vllm"}
CODE = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
MESSAGES = [
    {"role": "user", "content": f"Rename `add` to `plus` in this code:\n```python\n{CODE}```"}
]
PREDICTION = "```python\n" + CODE.replace("add", "plus") + "```"


def test_judge_accepts_the_matching_prefix_then_the_engines_token() -> None:
    inf = float("inf")
    assert judge([5, 6, 7], [5, 6, 9, 1], [inf] * 4, 1e-3) == ([5, 6, 9], 2, False)
    assert judge([5, 6], [5, 6, 8], [inf] * 3, 1e-3) == ([5, 6, 8], 2, False)
    assert judge([5, 6], [5, 6, 8], [inf, 1e-4, inf], 1e-3) == ([5], 1, True)


def _settings(url: str, **endpoint: Any) -> Any:
    return build_settings(
        {
            "auth": False,
            "endpoints": [
                {
                    "name": name,
                    "kind": kind,
                    "base_url": f"{url}/v1",
                    "models": [f"smollm2-{name}"],
                    "verify": "remote",
                    "tokenizer": "smollm2-135m",
                    "verify_check_interval_s": 0,
                    # pinned: drafts always pay (timings on a shared CPU decide nothing here)
                    "verify_round_trip_s": 0.001,
                    "verify_token_s": 1.0,
                    "retries": 0,
                    **endpoint,
                }
                for name, kind in KINDS.items()
            ],
        },
        "test",
    )


@pytest.fixture(scope="module")
def standin(engine: Any) -> Iterator[tuple[RemoteStandIn, str]]:
    server = RemoteStandIn(engine)
    with serve(server.app) as url:
        yield server, url


@pytest.fixture(scope="module")
def gateway(standin: tuple[RemoteStandIn, str]) -> Iterator[tuple[Any, str]]:
    app = create_app(_settings(standin[1]), environ={})
    with serve(app) as url:
        for remote in app.state.runtime.remote.values():
            assert remote.checked.wait(120)
        yield app, url


@pytest.fixture
def fresh(standin: tuple[RemoteStandIn, str]) -> RemoteStandIn:
    standin[0].reset()
    return standin[0]


def _greedy(url: str, model: str, **extra: Any) -> str:
    """The engine's own greedy answer: drafting off, so the request passes through."""
    body = {
        "model": model,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 24,
        "draftgate": {"draft": False},
        **extra,
    }
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert response.headers["x-draftgate-remote-verify"] == "passthrough:draft-off"
    return str(response.json()["choices"][0]["message"]["content"])


def test_the_self_test_finds_the_standin_exact(gateway: tuple[Any, str]) -> None:
    records = httpx.get(f"{gateway[1]}/v1/endpoints", timeout=30).json()["data"]
    states = {r["name"]: (r["remote_verify"], r["remote_verify_agreement"]) for r in records}
    assert states == {"sg": ("exact", 1.0), "vl": ("exact", 1.0)}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_verified_stream_is_the_engines_greedy_answer(
    gateway: tuple[Any, str], fresh: RemoteStandIn, name: str
) -> None:
    url = gateway[1]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=f"smollm2-{name}",
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        prediction={"type": "content", "content": PREDICTION},
    )
    assert raw.headers["x-draftgate-prediction"] == "verified-remotely"
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    details = usage.completion_tokens_details
    assert details is not None
    predicted = len(gateway[0].state.runtime.remote[name]._tokenizer.encode(PREDICTION))
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == predicted
    assert details.accepted_prediction_tokens > 0
    assert fresh.scores > 0
    remote = chunks[-2].model_extra["draftgate"]["remote"]
    assert remote["scoring_requests"] == fresh.scores
    assert remote["round_trips"] < usage.completion_tokens  # drafts saved round trips
    assert text == _greedy(url, f"smollm2-{name}")


def test_completions_respect_stop_and_max_tokens(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    url = gateway[1]
    body = {"model": "smollm2-sg", "prompt": CODE, "temperature": 0, "max_tokens": 12}
    verified = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert verified.headers["x-draftgate-prediction"] == "verified-remotely"
    answer = verified.json()
    assert answer["usage"]["completion_tokens"] == 12
    assert answer["choices"][0]["finish_reason"] == "length"
    plain = httpx.post(
        f"{url}/v1/completions", json={**body, "draftgate": {"draft": False}}, timeout=120
    ).json()
    assert answer["choices"][0]["text"] == plain["choices"][0]["text"]
    stop = plain["choices"][0]["text"].strip().split()[1]
    stopped = httpx.post(f"{url}/v1/completions", json={**body, "stop": [stop]}, timeout=120)
    text = stopped.json()["choices"][0]["text"]
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"
    assert stop not in text and plain["choices"][0]["text"].startswith(text)


def test_requests_pass_through_where_drafts_cannot_pay(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    remote = gateway[0].state.runtime.remote["sg"]
    pinned = remote.pacing
    remote.pacing = Pacing.configured(10.0, 0.001)  # a round trip costs 10,000 tokens
    try:
        body = {"model": "smollm2-sg", "messages": MESSAGES, "temperature": 0, "max_tokens": 4}
        response = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
    finally:
        remote.pacing = pinned
    assert response.status_code == 200
    assert response.headers["x-draftgate-remote-verify"] == "passthrough:does-not-pay"
    assert fresh.scores == 0


def test_sampled_requests_pass_through_and_say_so(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    body = {"model": "smollm2-vl", "messages": MESSAGES, "temperature": 0.7, "max_tokens": 4}
    response = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200
    assert response.headers["x-draftgate-remote-verify"] == "passthrough:sampled"
    assert fresh.scores == 0


def _stream(url: str, model: str) -> tuple[str, list[dict[str, Any]]]:
    body = {
        "model": model,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 24,
        "stream": True,
        "prediction": {"type": "content", "content": PREDICTION},
    }
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.headers["x-draftgate-prediction"] == "verified-remotely"
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append({"done": True} if data == "[DONE]" else json.loads(data))
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
    )
    return text, events


def test_a_failed_round_trip_continues_as_plain_decoding(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    fresh.fail_scores_after = 1
    text, events = _stream(gateway[1], "smollm2-vl")
    assert events[-1] == {"done": True}
    assert events[-2]["draftgate"]["remote"]["recovered"] == 1
    assert fresh.scores == 2  # the failed one included (a cached draft's second ask, or not)
    fresh.reset()
    assert text == _greedy(gateway[1], "smollm2-vl")


def test_near_ties_are_left_to_the_engines_own_decoding(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    fresh.tie_every = 3  # the runner-up ties the argmax at every third position
    text, events = _stream(gateway[1], "smollm2-sg")
    remote = events[-2]["draftgate"]["remote"]
    assert remote["near_ties"] > 0
    assert remote["plain_decodes"] >= remote["near_ties"]
    fresh.reset()
    assert text == _greedy(gateway[1], "smollm2-sg")


def test_a_server_gone_mid_answer_ends_the_stream_with_an_error(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    fresh.gone_after_scores = 1
    text, events = _stream(gateway[1], "smollm2-sg")
    assert "error" in events[-1] and {"done": True} not in events
    assert text  # the first round's tokens were sent, once
    fresh.reset()
    assert _greedy(gateway[1], "smollm2-sg").startswith(text)


def test_an_inexact_engine_is_approximate_and_stays_off(
    standin: tuple[RemoteStandIn, str], fresh: RemoteStandIn
) -> None:
    fresh.perturb_every = 5
    config = _settings(standin[1]).endpoints[0]

    async def check() -> tuple[str, float, bool, bool]:
        remote = RemoteEndpoint(config, Corpus(open_store(None)), {})
        try:
            test = await remote.check()
            strict = remote.enabled
            remote.config = config.model_copy(update={"verify": "remote-approximate"})
            return test.state, test.agreement, strict, remote.enabled
        finally:
            await remote.aclose()

    state, agreement, strict, accepted = asyncio.run(check())
    assert state == "approximate" and 0 < agreement < 1
    assert not strict and accepted


def test_audits_report_round_trips_per_token_and_cached_tokens_per_round() -> None:
    def record(tokens: int, remote: dict[str, Any] | None) -> RequestRecord:
        stats = {"verify_steps": 1, "remote": remote} if remote else {"verify_steps": 1}
        return RequestRecord(
            item="a",
            category="code_edit",
            config="c",
            setting="s",
            concurrency=1,
            round=0,
            status=200,
            ttft_s=0.1,
            e2e_s=1.0,
            output_tokens=tokens,
            draft_stats=stats,
            finish_reason="stop",
        )

    records = [
        record(20, {"round_trips": 4, "cached_tokens_per_round": [90, 100]}),
        record(10, {"round_trips": 6, "cached_tokens_per_round": [50]}),
        record(30, None),  # a local endpoint's answer: not counted
    ]
    stats = group_stats(records, config="c", setting="s", concurrency=1, category="all")
    assert stats.remote_round_trips_per_token == 10 / 30
    assert stats.remote_cached_tokens_per_round == 80
    local = group_stats(records[2:], config="c", setting="s", concurrency=1, category="all")
    assert local.remote_round_trips_per_token is None
