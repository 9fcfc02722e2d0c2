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
from gateway.audit.figures import group_stats
from gateway.config import build_settings
from gateway.endpoints.cache_salt import CacheSalts
from gateway.endpoints.remote import context as context_module
from gateway.endpoints.remote import endpoint as endpoint_module
from gateway.endpoints.remote.context import TokenIds
from gateway.endpoints.remote.endpoint import RemoteEndpoint
from gateway.endpoints.remote.failures import RemoteFailure
from gateway.endpoints.remote.verify import Pacing, judge
from gateway.endpoints.remote.wire import Ask, engine_client
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
    assert stopped.headers["x-draftgate-prediction"] == "verified-remotely"
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"
    assert stopped.json()["choices"][0]["stop_reason"] == stop  # which stop string, as vLLM
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


def test_a_does_not_pay_verdict_is_measured_again(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    remote = gateway[0].state.runtime.remote["sg"]
    pinned = remote.pacing
    remote.pacing = Pacing(round_trip_s=10.0, token_s=0.001)  # measured: a slow moment
    remote.remeasure_s = 0.0
    remote.checked.clear()
    try:
        body = {"model": "smollm2-sg", "messages": MESSAGES, "temperature": 0, "max_tokens": 4}
        response = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
        assert response.headers["x-draftgate-remote-verify"] == "passthrough:does-not-pay"
        assert remote.checked.wait(120)  # a self-test ran in the background
        measured = remote.pacing
    finally:
        remote.pacing = pinned
        remote.remeasure_s = endpoint_module.REMEASURE_S
    assert measured.measured_round_trips > 0 and measured.round_trip_s != 10.0
    assert remote.self_test is not None and remote.self_test.state == "exact"


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


def test_a_verified_messages_stream_counts_the_prompt_at_its_start(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    body = {
        "model": "smollm2-vl",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
    }
    with httpx.stream("POST", f"{gateway[1]}/v1/messages", json=body, timeout=120) as r:
        assert r.headers["x-draftgate-prediction"] == "verified-remotely"
        text = r.read().decode()
    events = [json.loads(b.split("data: ", 1)[1]) for b in text.strip().split("\n\n")]
    start = events[0]["message"]["usage"]
    final = next(e for e in events if e["type"] == "message_delta")["usage"]
    assert start["input_tokens"] == final["input_tokens"] > 0
    assert start["cache_read_input_tokens"] == final["cache_read_input_tokens"] == 0


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


def test_audits_report_round_trips_per_token() -> None:
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
        record(20, {"round_trips": 4}),
        record(10, {"round_trips": 6}),
        record(30, None),  # a local endpoint's answer: not counted
    ]
    stats = group_stats(records, config="c", setting="s", concurrency=1, category="all")
    assert stats.remote_round_trips_per_token == 10 / 30
    local = group_stats(records[2:], config="c", setting="s", concurrency=1, category="all")
    assert local.remote_round_trips_per_token is None


# -- vLLM 0.32's prefix cache: rows of cached positions are never read ------------------------


@pytest.fixture
def vllm(gateway: tuple[Any, str], fresh: RemoteStandIn) -> Iterator[Any]:
    """The gateway's vLLM client, reading the cache again (as after a start)."""
    client = gateway[0].state.runtime.remote["vl"].client
    client.cache_note = None
    yield client
    client.cache_note = None


def _verified(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 24,
        "prediction": {"type": "content", "content": PREDICTION},
        **extra,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def _exact(text: str) -> dict[str, str]:
    return {"type": "content", "content": text}


def _text(response: httpx.Response) -> str:
    return str(response.json()["choices"][0]["message"]["content"])


def test_rows_of_cached_positions_are_never_read(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    """The same answer twice, predicted exactly: the second one's drafts were scored
    before, so vLLM serves them from its cache with uninitialised rows; only rows past
    ``cached_tokens`` count."""
    greedy = _greedy(gateway[1], "smollm2-vl")
    answers = [_verified(gateway[1], "smollm2-vl", prediction=_exact(greedy)) for _ in range(2)]
    assert fresh.garbage_rows > 0 and max(fresh.cached) > 0
    assert vllm.cache_note is None  # cached_tokens said which rows were computed
    for answer in answers:
        assert answer.status_code == 200
        assert answer.headers["x-draftgate-prediction"] == "verified-remotely"
        assert _text(answer) == greedy


def test_without_cached_tokens_the_cache_is_not_read(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    fresh.prompt_tokens_details = False  # vLLM without --enable-prompt-tokens-details
    greedy = _greedy(gateway[1], "smollm2-vl")
    answers = [_verified(gateway[1], "smollm2-vl", prediction=_exact(greedy)) for _ in range(2)]
    assert "cached_tokens" in (vllm.cache_note or "")
    assert [(a.status_code, _text(a)) for a in answers] == [(200, greedy)] * 2


def test_non_finite_rows_end_verification_not_the_answer(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    """vLLM's 400 "Out of range float values are not JSON compliant": the answer goes on
    as plain decoding, and the client stops reading the cache."""
    fresh.nonfinite_garbage = True
    greedy = _greedy(gateway[1], "smollm2-vl")
    answers = [_verified(gateway[1], "smollm2-vl", prediction=_exact(greedy)) for _ in range(2)]
    assert "non-finite" in (vllm.cache_note or "")
    assert [(a.status_code, _text(a)) for a in answers] == [(200, greedy)] * 2


def _endpoint_check(url: str, name: str) -> tuple[Any, RemoteEndpoint]:
    config = next(e for e in _settings(url).endpoints if e.name == name)

    async def check() -> tuple[Any, RemoteEndpoint]:
        remote = RemoteEndpoint(config, Corpus(open_store(None)), {})
        try:
            return await remote.check(), remote
        finally:
            await remote.aclose()

    return asyncio.run(check())


def test_the_self_test_scores_through_the_cache_and_names_the_server(
    standin: tuple[RemoteStandIn, str], fresh: RemoteStandIn
) -> None:
    test, _ = _endpoint_check(standin[1], "vl")
    assert test.state == "exact"
    assert fresh.garbage_rows > 0 and max(fresh.cached) > 0  # rows were served from cache
    assert "server vLLM 0.32.0" in test.detail


def test_the_self_test_says_why_unusable_rows_keep_verification_off(
    standin: tuple[RemoteStandIn, str], fresh: RemoteStandIn
) -> None:
    fresh.corrupt = "oov-ids"  # ids outside the vocabulary in every generate answer
    test, remote = _endpoint_check(standin[1], "vl")
    assert test.state == "failed" and not remote.enabled
    assert "unusable rows" in test.detail and "vocabulary" in test.detail
    assert "server vLLM 0.32.0" in test.detail


def test_without_the_token_in_endpoint_the_self_test_fails(
    standin: tuple[RemoteStandIn, str], fresh: RemoteStandIn
) -> None:
    fresh.scale_out = False  # vLLM without --enable-scale-out
    test, remote = _endpoint_check(standin[1], "vl")
    assert test.state == "failed" and not remote.enabled
    assert "HTTP 404" in test.detail


# -- an upstream that cannot be trusted ----------------------------------------------------


@pytest.mark.parametrize(
    "corrupt", ["not-json", "list-event", "huge-line", "huge-body", "oov-ids", "trickle"]
)
def test_a_hostile_upstream_gives_a_recovered_answer_or_a_502(
    gateway: tuple[Any, str],
    fresh: RemoteStandIn,
    vllm: Any,
    corrupt: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """From the third scoring request on, every generate answer is hostile: the answer
    cannot be recovered, so it is a 502 in the OpenAI shape; no traceback in the log."""
    remote = gateway[0].state.runtime.remote["vl"]
    deadline = vllm.deadline_s
    vllm.deadline_s = 2.0  # a trickle never ends: the total deadline does
    fresh.corrupt, fresh.corrupt_after_scores = corrupt, 2
    try:
        with caplog.at_level("WARNING"):
            answer = _verified(gateway[1], "smollm2-vl", max_tokens=64)
    finally:
        vllm.deadline_s = deadline
    assert remote.enabled
    assert answer.status_code == 502
    assert answer.json()["error"]["type"] == "upstream_error"
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(("corrupt", "said"), [("huge-line", "line over"), ("huge-body", "over")])
def test_answers_are_read_within_their_bound(
    standin: tuple[RemoteStandIn, str], fresh: RemoteStandIn, corrupt: Any, said: str
) -> None:
    fresh.corrupt = corrupt

    async def ask() -> str:
        client = engine_client("vllm", standin[1], {}, 30.0, 5.0)
        ask = Ask(fresh.vocab_size)
        try:
            with pytest.raises(RemoteFailure) as failed:
                if corrupt == "huge-line":
                    _ = [b async for b in client.decode(TokenIds([1, 2, 3]), 4, ask)]
                else:
                    await client.score(TokenIds([1, 2, 3]), [4, 5], ask)
            return str(failed.value)
        finally:
            await client.aclose()

    assert said in asyncio.run(ask())


def test_a_hostile_first_answer_passes_through(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    fresh.corrupt, fresh.corrupt_after_scores = "not-json", 0  # the OpenAI API stays sane
    answer = _verified(gateway[1], "smollm2-vl")
    assert answer.status_code == 200
    assert answer.headers["x-draftgate-remote-verify"] == "passthrough:failed-before-output"


def test_upstream_cookies_are_never_sent_back(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    fresh.set_cookie = True
    for _ in range(2):
        assert _verified(gateway[1], "smollm2-vl").status_code == 200
    assert fresh.scores > 1 and fresh.cookies == []


def test_proxy_settings_in_the_environment_are_not_read(
    standin: tuple[RemoteStandIn, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    async def tokenize() -> list[int]:
        client = engine_client("vllm", standin[1], {}, 30.0, 5.0)
        try:
            return await client.tokenize("hello")
        finally:
            await client.aclose()

    assert asyncio.run(tokenize())


# -- budgets, tenants and what callers see --------------------------------------------------


def test_an_answer_without_max_tokens_is_bounded_and_charged_by_the_cap(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    remote = gateway[0].state.runtime.remote["sg"]
    config = remote.config
    assert config.answer_tokens(None) == config.max_tokens_cap  # what admission charges
    remote.config = config.model_copy(update={"max_tokens_cap": 6})
    try:
        body = {"model": "smollm2-sg", "messages": MESSAGES, "temperature": 0}
        answer = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
    finally:
        remote.config = config
    assert answer.headers["x-draftgate-prediction"] == "verified-remotely"
    assert answer.json()["usage"]["completion_tokens"] == 6
    assert answer.json()["choices"][0]["finish_reason"] == "length"


def test_the_cache_is_salted_per_tenant_and_cached_tokens_stay_private(
    gateway: tuple[Any, str], fresh: RemoteStandIn, vllm: Any
) -> None:
    answers = [_verified(gateway[1], f"smollm2-{name}") for name in ("vl", "sg", "vl")]
    assert max(fresh.cached) > 0  # the engine served cached tokens ...
    for answer in answers:  # ... and no caller hears of them
        body = answer.json()
        details = body["usage"].get("prompt_tokens_details") or {}
        assert not details.get("cached_tokens")
        assert "cached_tokens_per_round" not in body["draftgate"]["remote"]
    salts = {api: {s for a, s in fresh.salts if a == api} for api in ("vllm", "sglang")}
    assert [len(s) for s in salts.values()] == [1, 1]  # one tenant: one salt per server
    for (value,) in salts.values():
        assert value is not None and len(value) == 43 and not set(value) & set("@/\\\0")
    salt = CacheSalts(b"k" * 32)
    assert salt("a") != salt("b") and salt("a") == CacheSalts(b"k" * 32)("a")
    assert CacheSalts()("a") != CacheSalts()("a")  # keyed: nobody computes another's


def test_a_client_chosen_field_name_never_reaches_a_header_as_is(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    body = {
        "model": "smollm2-vl",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 2,
        "x\u00e9\r\nSet-Cookie: a=b": 1,
    }
    answer = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
    assert answer.headers["x-draftgate-remote-verify"] == "passthrough:unsupported:unknown-field"
    assert "set-cookie" not in answer.headers


# -- work off the event loop ---------------------------------------------------------------


def test_a_prompt_no_context_holds_passes_through_untokenized(
    gateway: tuple[Any, str], fresh: RemoteStandIn
) -> None:
    body = {
        "model": "smollm2-vl",
        "messages": [{"role": "user", "content": "x" * 6_000_000}],
        "temperature": 0,
        "max_tokens": 4,
    }
    answer = httpx.post(f"{gateway[1]}/v1/chat/completions", json=body, timeout=120)
    assert answer.headers["x-draftgate-remote-verify"] == "passthrough:prompt-too-long"
    assert answer.status_code == 400  # the engine's own answer to a prompt over its context
    assert fresh.scores == 0 and fresh.decodes == 0


def test_prompt_work_runs_on_a_worker_thread(
    gateway: tuple[Any, str], fresh: RemoteStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    loops: list[bool] = []
    real = endpoint_module.prepare

    def prepare(*args: Any) -> Any:
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:  # no event loop runs in this thread
            loops.append(False)
        return real(*args)

    monkeypatch.setattr(endpoint_module, "prepare", prepare)
    answer = _verified(gateway[1], "smollm2-sg")
    assert answer.headers["x-draftgate-prediction"] == "verified-remotely"
    assert loops == [False]


def test_a_round_encodes_only_the_tokens_it_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[int] = []
    real = context_module._ids_text

    def counting(ids: Any) -> bytes:
        encoded.append(len(ids))
        return real(ids)

    monkeypatch.setattr(context_module, "_ids_text", counting)
    prompt = list(range(5000))
    context = TokenIds(prompt)
    for step in range(20):  # twenty rounds: a 4-token draft, then 3 tokens committed
        draft = [7, 8, 9, step]
        assert json.loads(context.json(draft)) == context.ids + draft
        context.extend([1, 2, step])
    assert context.ids == prompt + [t for s in range(20) for t in (1, 2, s)]
    assert sum(encoded) == 5000 + 20 * (4 + 3)  # the prompt once, then only new tokens
