"""The prediction policy as a table: request x endpoint capability -> outcome."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.endpoints.capabilities import CAPABILITIES
from gateway.errors import InvalidRequest
from gateway.prediction_policy import (
    check_document_count,
    check_header_document_count,
    check_raw_document_count,
    decide,
    document_ids,
    header_document_ids,
    upstream_body,
)
from sdk.wire import ChatCompletionRequest, CompletionRequest

BASE: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
PRED = {"prediction": {"type": "content", "content": "x = 1"}}


def chat(**extra: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({**BASE, **extra})


@pytest.mark.parametrize(
    ("kind", "model", "extra", "docs", "status"),
    [
        ("openai", "gpt-4o-mini", PRED, [], "passed"),
        ("openai", "o3-mini", PRED, [], "dropped:unsupported"),
        ("openai", "gpt-4.1", {}, [], "none"),
        ("openai", "gpt-4.1", {}, ["a.py"], "synthesized"),
        ("openai", "gpt-4.1", {**PRED, "audio": {"voice": "x"}}, [], "dropped:audio"),
        ("openai", "gpt-4.1", {**PRED, "modalities": ["text", "audio"]}, [], "dropped:modalities"),
        ("openai", "gpt-4.1", {**PRED, "presence_penalty": -0.5}, [], "passed"),
        ("openai", "gpt-4.1", {**PRED, "draftgate": {"draft": False}}, [], "dropped:draft-off"),
        ("mistral", "codestral-latest", PRED, [], "passed"),
        ("mistral", "mistral-small", PRED, [], "dropped:unsupported"),
        ("fireworks", "accounts/fireworks/models/x", PRED, [], "passed"),
        ("vllm", "llama", PRED, [], "dropped:unsupported"),
        ("sglang", "llama", {}, ["a.py"], "dropped:unsupported"),
        ("llamacpp", "q", PRED, [], "dropped:unsupported"),
        ("local", "smollm2", PRED, [], "passed"),
    ],
)
def test_decide(kind: str, model: str, extra: dict[str, Any], docs: list[str], status: str) -> None:
    decision = decide(chat(**extra), CAPABILITIES[kind], upstream_model=model, doc_ids=docs)
    assert decision.status == status
    assert decision.synthesize == (status == "synthesized")
    assert decision.strip_prediction == (status.startswith("dropped:") and "prediction" in extra)


def test_azure_needs_a_recent_api_version() -> None:
    azure = CAPABILITIES["azure"]
    old = decide(chat(**PRED), azure, upstream_model="gpt-4o", doc_ids=[], api_version="2024-10-21")
    new = decide(
        chat(**PRED), azure, upstream_model="gpt-4o", doc_ids=[], api_version="2025-01-01-preview"
    )
    assert (old.status, new.status) == ("dropped:api-version", "passed")


def test_override_beats_the_table() -> None:
    decision = decide(
        chat(**PRED), CAPABILITIES["vllm"], upstream_model="x", doc_ids=[], accepts_override=True
    )
    assert decision.status == "passed"


def test_local_endpoints_verify() -> None:
    local = CAPABILITIES["local"]
    assert (
        decide(chat(), local, upstream_model="", doc_ids=[], local=True).status
        == "verified-locally"
    )
    off = chat(**PRED, draftgate={"draft": False})
    assert (
        decide(off, local, upstream_model="", doc_ids=[], local=True).status == "dropped:draft-off"
    )


def test_completions_api_cannot_carry_predictions() -> None:
    request = CompletionRequest.model_validate({"model": "m", "prompt": "p"})
    decision = decide(request, CAPABILITIES["openai"], upstream_model="gpt-4o", doc_ids=["a"])
    assert decision.status == "dropped:completions-api"


def test_document_ids_from_extension_and_header() -> None:
    request = chat(draftgate={"documents": ["a.py", "b.py"]})
    assert header_document_ids(" c.py , a%2Cb.txt,,") == ["c.py", "a,b.txt"]
    assert document_ids(request, "b.py, c.py", 4) == ["a.py", "b.py", "c.py"]
    with pytest.raises(InvalidRequest):  # repeats count toward the limit
        document_ids(request, "b.py, c.py", 3)


def test_document_count_is_checked_before_validation_as_after() -> None:
    many = {**BASE, "draftgate": {"documents": ["a.py", "a.py", "b.py"]}}
    check_document_count(many, 3)
    with pytest.raises(InvalidRequest) as caught:
        check_document_count(many, 2)
    assert (caught.value.code, caught.value.param) == ("too_many_documents", "draftgate.documents")
    with pytest.raises(InvalidRequest):
        document_ids(chat(**many), None, 2)
    for odd in ({"documents": "abc"}, [1, 2, 3]):
        check_document_count({**BASE, "draftgate": odd}, 2)  # left to validation


def _ids(count: int, **fields: Any) -> bytes:
    return json.dumps(
        {**BASE, "draftgate": {"documents": [f"d{i}.py" for i in range(count)], **fields}}
    ).encode()


def test_too_many_document_ids_are_counted_in_the_raw_body() -> None:
    check_raw_document_count(_ids(64), 64)
    for raw in (_ids(65), _ids(100_000, draft=True), _ids(65).replace(b": [", b":\n[")):
        with pytest.raises(InvalidRequest) as caught:
            check_raw_document_count(raw, 64)
        assert (caught.value.code, caught.value.param) == (
            "too_many_documents",
            "draftgate.documents",
        )
    # ids holding quotes, brackets and commas are counted no higher than they are
    odd = [f'd{i}"],[",' if i % 2 else f"d{i}\\" for i in range(64)]
    check_raw_document_count(json.dumps({**BASE, "draftgate": {"documents": odd}}).encode(), 64)


@pytest.mark.parametrize(
    "body",
    [
        {**BASE, "metadata": {"documents": [f"d{i}" for i in range(100)]}},
        {**BASE, "x": {"draftgate": {"documents": [f"d{i}" for i in range(100)]}}},
        {**BASE, "draftgate": {"x": {"documents": [f"d{i}" for i in range(100)]}}},
        {**BASE, "messages": [{"role": "user", "content": '"documents": [' + '"a",' * 100}]},
    ],
    ids=["elsewhere", "nested-extension", "nested-in-extension", "in-a-string"],
)
def test_lists_that_are_not_the_extension_s_are_left_to_the_parse(body: dict[str, Any]) -> None:
    check_raw_document_count(json.dumps(body).encode(), 64)
    check_document_count(body, 64)


def test_an_escaped_key_is_counted_after_the_parse() -> None:
    raw = _ids(65).replace(b'"documents"', b'"\\u0064ocuments"')
    check_raw_document_count(raw, 64)  # not recognised in the bytes...
    with pytest.raises(InvalidRequest):
        check_document_count(json.loads(raw), 64)  # ...but refused once parsed


def test_header_document_ids_are_counted_without_decoding_them() -> None:
    check_header_document_count(b"a.py, b.py", 2)
    check_header_document_count(b"a.py" + b", ,\t" * 1000 + b"b.py", 2)  # blanks do not count
    with pytest.raises(InvalidRequest) as caught:
        check_header_document_count(b",".join(b"d%d" % i for i in range(100_000)), 64)
    assert caught.value.message.startswith("at least 65 documents named")


async def test_upstream_body_rewrites_only_when_needed() -> None:
    raw = json.dumps({**BASE, "model": "gpt-4o", **PRED}).encode()
    data = json.loads(raw)
    same = await upstream_body(
        raw, data, upstream_model="gpt-4o", strip_prediction=False, prediction_text=None
    )
    assert same is raw
    stripped = json.loads(
        await upstream_body(
            raw, data, upstream_model="gpt-4o", strip_prediction=True, prediction_text=None
        )
    )
    assert "prediction" not in stripped and stripped["messages"] == BASE["messages"]
    renamed = json.loads(
        await upstream_body(
            raw, data, upstream_model="real", strip_prediction=False, prediction_text="y"
        )
    )
    assert renamed["model"] == "real"
    assert renamed["prediction"] == {"type": "content", "content": "y"}
    assert data["model"] == "gpt-4o"  # the parsed request is not mutated


async def test_an_answer_bound_past_the_cap_is_clamped_whatever_the_api() -> None:
    common = {"upstream_model": "m", "strip_prediction": False, "prediction_text": None}
    bodies = [
        {"model": "m", "max_tokens": 32000},  # chat, completions, Messages
        {"model": "m", "max_completion_tokens": 32000, "max_tokens": 5},  # chat
        {"model": "m", "max_output_tokens": 32000},  # Responses
    ]
    for data in bodies:
        raw = json.dumps(data).encode()
        sent = json.loads(await upstream_body(raw, data, **common, max_tokens_cap=100))
        assert sent == {k: min(v, 100) if k != "model" else v for k, v in data.items()}
        assert await upstream_body(raw, data, **common, max_tokens_cap=None) is raw
        assert await upstream_body(raw, data, **common, max_tokens_cap=32000) is raw
    raw = b'{"model": "m", "max_tokens": null}'  # not a bound: left for the upstream to judge
    assert await upstream_body(raw, json.loads(raw), **common, max_tokens_cap=100) is raw
