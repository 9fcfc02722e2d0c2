"""The local endpoint's logprobs, n and tool calls through the real ``openai`` client, on the
tiny model (fast; the same checks on SmolLM2 are in tests/gateway/test_local_fields.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.audit.serve import serve_in_thread
from gateway.cli.serve import verifier_settings
from local_verifier.engine import Engine
from local_verifier.loader import LoadedModel

MODEL = "tiny"
MESSAGES: list[Any] = [{"role": "user", "content": "x = 1\ny = 2\nz = x + y\nprint(z)\n" * 2}]
SAMPLED: dict[str, Any] = {"temperature": 1.0, "seed": 25, "max_tokens": 12}  # a seed whose
# text tokenizes back to its tokens, so its prediction is accepted


@pytest.fixture(scope="module")
def client(tiny_lm: LoadedModel) -> Iterator[openai.OpenAI]:
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    engine = Engine(tiny_lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=4)
    app = create_app(verifier_settings(MODEL), engines={"local": engine})
    with serve_in_thread(app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def content_logprobs(answer: Any) -> list[dict[str, Any]]:
    return [e.model_dump() for e in answer.choices[0].logprobs.content]


def test_chat_logprobs_equal_with_drafts_on_and_off(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "logprobs": True, **SAMPLED}
    plain = client.chat.completions.create(
        **kw, top_logprobs=3, extra_body={"draftgate": {"draft": False}}
    )
    text = plain.choices[0].message.content
    assert text
    drafted = client.chat.completions.create(
        **kw, top_logprobs=3, prediction={"type": "content", "content": text}
    )
    assert (drafted.model_extra or {})["draftgate"]["accepted_tokens"] > 0
    assert drafted.choices[0].message.content == text
    entries = content_logprobs(plain)
    assert content_logprobs(drafted) == entries  # floats compared exactly
    assert len(entries) == plain.usage.completion_tokens
    assert b"".join(bytes(e["bytes"]) for e in entries).decode(errors="replace") == text
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in entries)
    assert all(e["top_logprobs"][0]["logprob"] >= e["logprob"] for e in entries)
    stream = client.chat.completions.create(**kw, top_logprobs=3, stream=True)
    streamed = [
        e.model_dump()
        for c in stream
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert streamed == entries


def test_completions_logprobs_legacy_shape(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt="x = 1\n", logprobs=2, **SAMPLED)
    choice = answer.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == choice.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 for top in lp.top_logprobs)


def test_n_answers_are_distinct_and_each_the_single_answer_with_seed_plus_index(
    client: openai.OpenAI,
) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, **SAMPLED}
    many = client.chat.completions.create(**kw, n=3)
    texts = [c.message.content for c in many.choices]
    assert [c.index for c in many.choices] == [0, 1, 2] and len(set(texts)) == 3
    singles = [
        client.chat.completions.create(**{**kw, "seed": SAMPLED["seed"] + i}) for i in range(3)
    ]
    assert texts == [s.choices[0].message.content for s in singles]
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    streamed = ["", "", ""]
    finished = set()
    for chunk in client.chat.completions.create(**kw, n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert streamed == texts and finished == {0, 1, 2}


def test_tool_choice_none_is_plain_generation(client: openai.OpenAI) -> None:
    """No tools shown, no grammar: the answer without tools (tool calls on SmolLM2:
    tests/gateway/test_local_tools.py; this model's context cannot hold the tool preamble)."""
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {}}}
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "seed": 1}
    answer = client.chat.completions.create(**kw, tools=[tool], tool_choice="none")
    assert answer.choices[0].message.tool_calls is None
    plain = client.chat.completions.create(**kw)
    assert answer.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 17}, "n"),
    ],
)
def test_bad_logprobs_and_n_are_400_naming_them(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **extra)
    assert err.value.param == param


def test_models_list_logprobs_and_n_as_supported(client: openai.OpenAI) -> None:
    table = (client.models.list().data[0].model_extra or {})["draftgate"]
    assert {"n", "logprobs", "top_logprobs", "response_format"} <= set(
        table["supported_parameters"]
    )
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(table["supported_parameters"])
