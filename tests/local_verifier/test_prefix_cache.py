"""Prefix reuse on the KV pool: a hit computes only the rest, bitwise equal to cold."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.kv_pool import BlockTable, KVPool, block_keys
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.model import SeqStep
from local_verifier.sampling import SamplingParams

SYSTEM = "You are a careful assistant. x = 1\ny = 2\nz = x + y\nprint(z)\n" * 4
BUDGET = 32
MAX_DRAFT = 8


def make_engine(lm: LoadedModel, **kw: Any) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(BUDGET + MAX_DRAFT + 1)]
    kw.setdefault("kv_cache_mb", 4)  # 512 blocks of the tiny model
    return Engine(lm, max_draft=MAX_DRAFT, token_budget=BUDGET, row_costs=costs, **kw)


def run(engine: Engine, req: GenerationRequest) -> tuple[list[int], str, GenerationStats]:
    items = list(engine.generate(req))
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    deltas = [i for i in items if isinstance(i, TextDelta)]
    return [t for d in deltas for t in d.token_ids], "".join(d.text for d in deltas), stats


def test_last_logits_with_a_cached_prefix_equal_cold(tiny_lm: LoadedModel) -> None:
    """Prompt K/V read from another sequence's published blocks gives the same logits and
    K/V as computing the whole prompt (torch.equal)."""
    model = tiny_lm.model
    pool = KVPool(KVStorage(tiny_lm.config, 32 * 16), 16)
    prompt = tiny_lm.tokenizer.encode(SYSTEM + "What is z?")
    n = len(prompt)
    assert n > 40

    def prefill(table: BlockTable, start: int) -> torch.Tensor:
        seq = SeqStep(
            tokens=torch.tensor(prompt[start:]),
            positions=torch.arange(start, n),
            new_slots=table.slots(start, n),
            context_slots=table.slots(0, start),
            logits="last",
        )
        return model.step([seq], pool.storage)[0]

    cold = BlockTable(pool)
    cold.reserve(n)
    cold_logits = prefill(cold, 0)
    keys = block_keys("t", prompt[:-1], 16)
    for block, key in zip(cold.blocks, keys, strict=False):
        pool.publish(block, key)
    warm = BlockTable(pool)
    warm.blocks = pool.lookup(keys)
    assert len(warm.blocks) == len(keys) >= 2
    warm.reserve(n)
    hit = len(keys) * 16
    warm_logits = prefill(warm, hit)
    assert torch.equal(warm_logits, cold_logits)
    keys = pool.storage.keys
    assert torch.equal(keys(warm.slots(hit, n)), keys(cold.slots(hit, n)))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)])
def test_answers_with_a_hit_equal_cold_answers(
    tiny_lm: LoadedModel, params: SamplingParams
) -> None:
    engine = make_engine(tiny_lm)
    cold_engine = make_engine(tiny_lm, prefix_cache=False)
    questions = ["What is z?", "Print x twice.", "What is z?"]
    for i, question in enumerate(questions):
        ids = tiny_lm.tokenizer.encode(SYSTEM + question)
        req = GenerationRequest(prompt_ids=ids, params=params, max_tokens=24, tenant="a")
        got = run(engine, req)
        want = run(cold_engine, req)
        assert got[:2] == want[:2]
        assert want[2].cached_tokens == 0
        if i > 0:  # the shared system prompt (and, for a repeat, more) came from the cache
            assert got[2].cached_tokens >= 48
    repeat = run(
        engine, GenerationRequest(prompt_ids=ids, params=params, max_tokens=24, tenant="a")
    )
    assert repeat[2].cached_tokens >= len(ids) - 16  # all full blocks but the last token's
    counts = engine.stats()
    hit, miss = counts.prefix_hit_tokens, counts.prefix_miss_tokens
    assert hit > 0 and miss > 0
    assert engine.pool.used() == 0 and engine.pool.cached() > 0
    assert len(cold_engine.prompt_indexes) == 0  # off: no drafter index is kept either


def test_prefixes_are_kept_per_tenant(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm)
    ids = tiny_lm.tokenizer.encode(SYSTEM + "What is z?")
    first = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=4, tenant="a"))
    other = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=4, tenant="b"))
    again = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=4, tenant="a"))
    assert first[2].cached_tokens == 0 and other[2].cached_tokens == 0
    assert again[2].cached_tokens > 0
    assert first[0] == other[0] == again[0]


def test_answers_enter_the_cache_and_eviction_makes_room(tiny_lm: LoadedModel) -> None:
    """A follow-up turn reuses the earlier answer's committed blocks; a pool just big enough
    for one request evicts cached blocks instead of refusing the next one."""
    engine = make_engine(tiny_lm, kv_cache_mb=12 * 16 * 512 / 2**20)  # 12 blocks
    ids = tiny_lm.tokenizer.encode(SYSTEM[:120])
    first, _, _ = run(engine, GenerationRequest(prompt_ids=ids, max_tokens=40, tenant="a"))
    follow = ids + first[:32]
    _, _, stats = run(engine, GenerationRequest(prompt_ids=follow, max_tokens=8, tenant="a"))
    assert stats.cached_tokens >= (len(ids) + 16) // 16 * 16 - 16  # prompt and answer blocks
    other = tiny_lm.tokenizer.encode("completely different text " * 8)
    assert len(other) + 100 >= engine.context_length  # it needs every block of the pool
    run(engine, GenerationRequest(prompt_ids=other, max_tokens=100, tenant="a"))
    assert engine.pool.used() == 0
    _, _, again = run(engine, GenerationRequest(prompt_ids=follow, max_tokens=8, tenant="a"))
    assert again.cached_tokens < stats.cached_tokens  # evicted to make room


def test_the_drafter_reuses_the_prompt_index_of_a_shared_prefix(tiny_lm: LoadedModel) -> None:
    """The second request with the same long prefix indexes only its own suffix for the
    drafter (counted work), and answers the same as an engine that re-indexes."""
    engine = make_engine(tiny_lm)
    ids = tiny_lm.tokenizer.encode(SYSTEM + "What is z?")
    run(engine, GenerationRequest(prompt_ids=ids, max_tokens=4, tenant="a"))
    before = engine.prompt_indexes.indexed_tokens
    follow = ids + tiny_lm.tokenizer.encode(" And x + z?")
    got = run(engine, GenerationRequest(prompt_ids=follow, max_tokens=24, tenant="a"))
    indexed = engine.prompt_indexes.indexed_tokens - before
    assert indexed <= len(follow) - len(ids) + 16 < len(ids) // 4
    fresh = make_engine(tiny_lm)
    want = run(fresh, GenerationRequest(prompt_ids=follow, max_tokens=24, tenant="a"))
    assert fresh.prompt_indexes.indexed_tokens == len(follow)
    assert got[:2] == want[:2]
    assert got[2].drafted_tokens == want[2].drafted_tokens  # the same drafts were proposed
