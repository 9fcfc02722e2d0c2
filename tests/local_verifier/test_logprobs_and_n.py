"""Logprobs from verify rows equal plain decoding's bitwise; ``submit_n`` answers equal
single requests with seed + i and compute the prompt once (tiny model)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spec_drafts import OracleDrafter, PassThrough

from local_verifier.chat_template import uses_tools
from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.loader import LoadedModel
from local_verifier.logprobs import TokenLogprob
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from local_verifier.testing.kv_cache import forward, new_cache

BUDGET, MAX_DRAFT = 32, 8
PROMPT = "x = 1\ny = 2\nz = x + y\nprint(z)\n" * 3  # several full KV blocks
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=11)


@pytest.fixture(scope="module")
def engine(tiny_lm: LoadedModel) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(BUDGET + MAX_DRAFT + 1)]
    return Engine(tiny_lm, max_draft=MAX_DRAFT, token_budget=BUDGET, row_costs=costs, kv_cache_mb=4)


def deltas(items: list[Any]) -> list[TextDelta]:
    return [i for i in items if isinstance(i, TextDelta)]


def logprobs_of(items: list[Any]) -> list[TokenLogprob]:
    return [lp for d in deltas(items) if d.token_ids for lp in d.logprobs or []]


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "seeded"])
def test_logprobs_with_drafts_equal_plain_bitwise(
    engine: Engine, tiny_lm: LoadedModel, params: SamplingParams
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    req = GenerationRequest(prompt_ids=ids, params=params, max_tokens=24, logprobs=3)
    plain = list(engine.generate(GenerationRequest(**{**req.__dict__, "draft": False})))
    tokens = [t for d in deltas(plain) for t in d.token_ids]
    drafter = OracleDrafter(tokens, tiny_lm.config.vocab_size, "partly", eos=2)
    drafted = list(engine.generate(req, drafter=drafter, controller=PassThrough(k=6, width=1)))
    stats = drafted[-1]
    assert isinstance(stats, GenerationStats) and stats.accepted_tokens > 0
    want, got = logprobs_of(plain), logprobs_of(drafted)
    assert [lp.token_id for lp in want] == tokens and len(want) == 24
    assert got == want  # floats compared exactly
    assert all(len(lp.top) == 3 for lp in got)


def test_logprobs_are_the_raw_models(tiny_lm: LoadedModel, engine: Engine) -> None:
    """The first token's figures are log_softmax of the raw logits after the prompt, whatever
    the temperature."""
    ids = tiny_lm.tokenizer.encode(PROMPT)
    logits = forward(
        tiny_lm.model, torch.tensor(ids), new_cache(tiny_lm, len(ids)), last_only=True
    )[-1]
    raw = torch.log_softmax(logits.float(), dim=-1)
    hot = SamplingParams(temperature=1.7, seed=1)
    (first, *_) = logprobs_of(
        list(
            engine.generate(GenerationRequest(prompt_ids=ids, params=hot, max_tokens=1, logprobs=2))
        )
    )
    assert first.logprob == pytest.approx(float(raw[first.token_id]), abs=1e-5)
    assert [t for t, _ in first.top] == raw.topk(2).indices.tolist()


def test_no_logprobs_unless_asked(engine: Engine, tiny_lm: LoadedModel) -> None:
    req = GenerationRequest(prompt_ids=tiny_lm.tokenizer.encode(PROMPT), max_tokens=4)
    assert all(d.logprobs is None for d in deltas(list(engine.generate(req))))
    with pytest.raises(ValueError, match="top_logprobs"):
        engine.generate(GenerationRequest(prompt_ids=[5], logprobs=21))


def test_n_answers_equal_single_requests_with_seed_plus_index(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    ids = tiny_lm.tokenizer.encode(PROMPT)
    req = GenerationRequest(prompt_ids=ids, params=SAMPLED, max_tokens=16, tenant="n-test")
    items: list[list[Any]] = [[], [], []]
    hits_before = engine.stats().prefix_hit_tokens
    engine.submit_n(req, 3, lambda i, item: items[i].append(item))
    assert engine.wait_idle(120)
    hits = engine.stats().prefix_hit_tokens - hits_before
    assert all(got[-1] is END and isinstance(got[-2], GenerationStats) for got in items)
    answers = [[t for d in deltas(got) for t in d.token_ids] for got in items]
    assert len({tuple(a) for a in answers}) == 3  # distinct under sampling
    # answers 1 and 2 read answer 0's full prompt blocks from the prefix cache
    assert hits == 2 * ((len(ids) - 1) // engine.pool.block_size) * engine.pool.block_size > 0
    for i, answer in enumerate(answers):
        params = SamplingParams(temperature=0.9, top_k=20, seed=SAMPLED.seed + i)
        single = GenerationRequest(prompt_ids=ids, params=params, max_tokens=16, draft=False)
        assert answer == [t for d in deltas(list(engine.generate(single))) for t in d.token_ids]


def test_plain_decoding_agrees_on_the_emitted_tokens(engine: Engine, tiny_lm: LoadedModel) -> None:
    """The engine's greedy tokens with logprobs on are generate_plain's."""
    ids = tiny_lm.tokenizer.encode(PROMPT)
    *_, result = generate_plain(tiny_lm, ids, SamplingParams(), 12)
    assert isinstance(result, PlainResult)
    req = GenerationRequest(prompt_ids=ids, max_tokens=12, logprobs=0)
    got = logprobs_of(list(engine.generate(req)))
    assert [lp.token_id for lp in got] == result.token_ids
    assert all(lp.top == [] for lp in got)


def test_token_bytes_join_to_the_text(tiny_lm: LoadedModel) -> None:
    """Byte-level tokens give their raw bytes (pieces of multi-byte characters included)."""
    tokenizer = tiny_lm.tokenizer
    for text in ["emoji 🙂🚀 and café, naïve, 日本語", "안녕하세요 세계.", "<|im_end|>"]:
        ids = tokenizer.encode(text)
        assert b"".join(tokenizer.token_bytes(t) for t in ids) == text.encode()


def test_tool_support_is_read_from_the_template(tiny_lm: LoadedModel) -> None:
    assert not tiny_lm.tokenizer.supports_tools  # the tiny template renders no tools
    assert uses_tools("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}")
    assert not uses_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
