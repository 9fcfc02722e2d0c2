"""Bounded per-request work on the tiny model through the gateway and the real ``openai``
client: answer length default and cap, n x max_tokens charged, and client errors (seed
range, a template's refusal, an over-long prediction, ids past the embedding) as 400s."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.audit.serve import serve_in_thread
from gateway.config import build_settings
from local_verifier.engine import Engine, GenerationRequest
from local_verifier.loader import LoadedModel
from tests.local_verifier.conftest import CHAT_TEMPLATE

MODEL = "tiny"
MESSAGES: list[Any] = [{"role": "user", "content": "x = 1\ny = 2\n"}]
CAP, DEFAULT = 40, 3
REFUSING_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}" + CHAT_TEMPLATE
)


def _engine(lm: LoadedModel) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    return Engine(lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=4)


@contextmanager
def _serve(lm: LoadedModel, **settings: Any) -> Iterator[str]:
    engine = _engine(lm)
    endpoint = {
        "name": "local",
        "kind": "local",
        "model": MODEL,
        "models": [MODEL],
        "max_tokens_cap": CAP,
        "max_tokens_default": DEFAULT,
    }
    config = build_settings({"endpoints": [endpoint], "auth": False, **settings}, "test")
    with serve_in_thread(create_app(config, engines={"local": engine})) as url:
        yield url
    engine.close()


@pytest.fixture(scope="module")
def gateway(tiny_lm: LoadedModel) -> Iterator[str]:
    tokenizer = copy.copy(tiny_lm.tokenizer)
    tokenizer.chat_template = REFUSING_TEMPLATE
    with _serve(dataclasses.replace(tiny_lm, tokenizer=tokenizer)) as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_answer_length_defaults_and_is_capped(gateway: str) -> None:
    client = _client(gateway)
    greedy: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "temperature": 0}
    banned = {"logit_bias": {str(t): -100 for t in range(3)}}  # no end of text
    absent = client.chat.completions.create(**greedy, extra_body=banned)
    assert absent.usage is not None and absent.usage.completion_tokens == DEFAULT
    over = client.chat.completions.create(**greedy, max_tokens=CAP + 4, extra_body=banned)
    assert over.usage is not None and over.usage.completion_tokens == CAP
    entry = next(m for m in httpx.get(f"{gateway}/v1/models").json()["data"] if m["id"] == MODEL)
    assert entry["draftgate"]["max_tokens_default"] == DEFAULT
    assert entry["draftgate"]["max_tokens_cap"] == CAP


def test_limiter_charges_every_answer(tiny_lm: LoadedModel) -> None:
    # 600 tokens a minute: 16 answers of CAP tokens cost more than that, two of 2 do not
    with _serve(tiny_lm, limits={"tokens_per_minute": 600}) as url:
        client = _client(url)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="x", n=16, max_tokens=CAP)
        answer = client.completions.create(model=MODEL, prompt="x", n=2, max_tokens=2)
        assert len(answer.choices) == 2


def test_seed_past_the_range_is_a_client_error(gateway: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(gateway).completions.create(
            model=MODEL, prompt="x", n=2, seed=2**64 - 1, temperature=1.0, max_tokens=2
        )
    assert err.value.param == "seed"
    assert "seed must be at most 2**64 - n" in err.value.message


def test_template_refusal_is_a_client_error(gateway: str) -> None:
    messages = [{"role": "system", "content": "be brief"}, *MESSAGES]
    with pytest.raises(openai.BadRequestError) as err:
        _client(gateway).chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert "System role not supported" in err.value.message


def test_prediction_longer_than_the_context_is_a_client_error(gateway: str) -> None:
    for text in ("x = 1\n" * 400, "y" * 2_000_000):  # tokenised; too many bytes to try
        with pytest.raises(openai.BadRequestError) as err:
            _client(gateway).chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=2,
                prediction={"type": "content", "content": text},
            )
        assert "prediction is longer than the model's context" in err.value.message


def test_token_ids_are_checked_against_the_embedding(tiny_lm: LoadedModel) -> None:
    engine = _engine(tiny_lm)
    vocab = tiny_lm.config.vocab_size
    with pytest.raises(ValueError, match="outside this model's vocabulary"):
        engine.generate(GenerationRequest(prompt_ids=[1, vocab]))
    with pytest.raises(ValueError, match="prediction: token id"):
        engine.generate(GenerationRequest(prompt="x", prediction_ids=[vocab + 3]))
    engine.close()
