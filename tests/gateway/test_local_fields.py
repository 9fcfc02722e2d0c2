"""Chat Completions fields on the local endpoint (real SmolLM2, real ``openai`` client):
what it honours equals the engine's own answer, everything else is a 400 naming it."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from local_verifier.engine import Engine, GenerationRequest, TextDelta
from local_verifier.logits_processors import Penalties
from local_verifier.sampling import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MODEL = "smollm2-135m"
MESSAGES: list[Any] = [{"role": "user", "content": "List three fruits, one per line."}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"extra_body": {"functions": [{"name": "f"}]}}, "functions"),
        ({"extra_body": {"ignore_eos": True}}, "ignore_eos"),
        ({"extra_body": {"guided_json": {"type": "object"}}}, "guided_json"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ],
)
def test_unhonoured_field_is_400_naming_it(
    local_url: str, extra: dict[str, Any], param: str
) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(**kwargs)
    assert err.value.param == param
    assert err.value.code == "unsupported_parameter"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 150}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
        ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ],
)
def test_bad_value_is_400_naming_the_field(
    local_url: str, extra: dict[str, Any], param: str
) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(**kwargs)
    assert err.value.param == param


def test_fields_set_to_off_are_accepted(local_url: str) -> None:
    off: dict[str, Any] = {"n": 1, "logprobs": False, "tool_choice": "none"}
    answer = client(local_url).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, **off
    )
    assert answer.choices[0].message.content


def _engine_text(engine: Engine, params: SamplingParams, penalties: Penalties) -> str:
    req = GenerationRequest(
        messages=MESSAGES, params=params, max_tokens=24, penalties=penalties, draft=False
    )
    return "".join(i.text for i in engine.generate(req) if isinstance(i, TextDelta))


@pytest.mark.parametrize("draft", [True, False])
def test_penalties_bias_and_min_p_reach_the_engine(
    local_url: str, engine: Engine, draft: bool
) -> None:
    """The HTTP answer equals the engine's with the same adjustments (drafts on or off),
    and differs from the answer without them."""
    tokenizer, vocab = engine.tokenizer, engine.lm.config.vocab_size
    banned = [t for t in range(vocab) if "\n" in tokenizer.decode([t])]  # every newline token
    answer = client(local_url).chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0.8,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.4,
        logit_bias={str(t): -100 for t in banned},
        extra_body={"repetition_penalty": 1.3, "min_p": 0.05, "draftgate": {"draft": draft}},
    )
    text = answer.choices[0].message.content
    params = SamplingParams(temperature=0.8, seed=3, min_p=0.05)
    penalties = Penalties(
        presence_penalty=0.5,
        frequency_penalty=0.4,
        repetition_penalty=1.3,
        logit_bias=dict.fromkeys(banned, -100.0),
    )
    assert text == _engine_text(engine, params, penalties)
    assert text != _engine_text(engine, SamplingParams(temperature=0.8, seed=3), Penalties())
    assert text and "\n" not in text


def test_models_list_what_a_local_model_honours(local_url: str) -> None:
    entry = next(m for m in client(local_url).models.list().data if m.id == MODEL)
    table = (entry.model_extra or {})["draftgate"]
    assert {"logit_bias", "min_p", "presence_penalty", "repetition_penalty"} <= set(
        table["supported_parameters"]
    )
    assert {"n", "logprobs", "top_logprobs"} <= set(table["supported_parameters"])
    assert "response_format" in table["supported_parameters"]
    assert {"tools", "tool_choice"} <= set(table["supported_parameters"])
    assert "functions" in table["unsupported_parameters"]


def test_logprobs_equal_with_drafts_on_and_off(local_url: str) -> None:
    """Seeded sampling: the answer drafted from a prediction of itself carries the same
    logprobs (exact floats) as the answer without drafts."""
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0.8,
        "seed": 5,
        "logprobs": True,
        "top_logprobs": 4,
    }
    plain = client(local_url).chat.completions.create(
        **kw, extra_body={"draftgate": {"draft": False}}
    )
    text = plain.choices[0].message.content
    drafted = client(local_url).chat.completions.create(
        **kw, prediction={"type": "content", "content": text}
    )
    assert (drafted.model_extra or {})["draftgate"]["accepted_tokens"] > 0
    assert drafted.choices[0].message.content == text
    want = [e.model_dump() for e in plain.choices[0].logprobs.content]
    assert [e.model_dump() for e in drafted.choices[0].logprobs.content] == want
    assert len(want) == 16 and "".join(e["token"] for e in want) == text


def test_n_answers_each_equal_the_single_answer_with_its_seed(local_url: str) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "seed": 9}
    many = client(local_url).chat.completions.create(**kw, n=2, temperature=1.0)
    texts = [c.message.content for c in many.choices]
    assert texts[0] != texts[1]
    for i, text in enumerate(texts):
        single = client(local_url).chat.completions.create(**{**kw, "seed": 9 + i}, temperature=1.0)
        assert single.choices[0].message.content == text
