"""Continuous batching on the tiny model: batched answers equal sequential ones bitwise
(greedy and seeded sampling, drafts on or off), cancellation frees blocks, admission."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from arrivals import together
from spec_drafts import OracleDrafter, PassThrough

from local_verifier.engine import END, Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.errors import EngineBusy, PromptTooLong
from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams
from lookup.draft import Source
from tests.local_verifier.collect import Collector

PROMPTS = [
    "def add(a, b):\n    return a + b\n\nThe quick brown fox",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "aaaa bbbb aaaa bbbb aaaa",
    "x = 1\ny = 2\nz = x + y\nprint(z)\n" * 6,  # several prompt chunks
]
MAX_DRAFT = 16
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=5)


def make_engine(lm: LoadedModel, **kw: Any) -> Engine:
    budget = kw.pop("token_budget", 32)
    costs = [1e-3 + 1e-5 * r for r in range(budget + MAX_DRAFT + 1)]
    kw.setdefault("kv_cache_mb", 4)  # 512 blocks of the tiny model
    return Engine(lm, max_draft=MAX_DRAFT, token_budget=budget, row_costs=costs, **kw)


@pytest.fixture(scope="module")
def engine(tiny_lm: LoadedModel) -> Engine:
    return make_engine(tiny_lm)


def alone(engine: Engine, req: GenerationRequest) -> list[int]:
    items = list(engine.generate(req))
    return [t for i in items if isinstance(i, TextDelta) for t in i.token_ids]


def ids_of(lm: LoadedModel, text: str) -> list[int]:
    return list(lm.tokenizer.encode(text))


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "seeded"])
def test_batched_with_drafts_equals_alone_without(
    engine: Engine, tiny_lm: LoadedModel, params: SamplingParams
) -> None:
    reqs = [
        GenerationRequest(prompt_ids=ids_of(tiny_lm, p), params=params, max_tokens=30)
        for p in PROMPTS
    ]
    want = [alone(engine, GenerationRequest(**{**r.__dict__, "draft": False})) for r in reqs]
    got = [Collector() for _ in reqs]
    with together(engine):
        for req, sink, expected in zip(reqs, got, want, strict=True):
            # drafts from the answer itself: long accepted runs, so the batch carries drafts
            drafter = OracleDrafter(expected, tiny_lm.config.vocab_size, "partly", eos=2)
            engine.submit(req, sink, drafter=drafter, controller=PassThrough(k=6, width=1))
    assert engine.wait_idle(120)
    assert [c.ids for c in got] == want
    assert sum(c.stats.accepted_tokens for c in got) > 0
    assert engine.pool.used() == 0


def test_lookup_drafter_batched_greedy_and_trees(engine: Engine, tiny_lm: LoadedModel) -> None:
    reqs = [GenerationRequest(prompt_ids=ids_of(tiny_lm, p), max_tokens=40) for p in PROMPTS]
    want = [alone(engine, GenerationRequest(**{**r.__dict__, "draft": False})) for r in reqs]
    got = [Collector() for _ in reqs + reqs]
    with together(engine):
        for req, sink in zip(reqs, got[: len(reqs)], strict=True):
            engine.submit(req, sink)
        for req, sink in zip(reqs, got[len(reqs) :], strict=True):  # again, as trees
            engine.submit(req, sink, controller=PassThrough(k=8, width=3))
    assert engine.wait_idle(120)
    assert [c.ids for c in got] == want + want


def test_seeded_sampling_reproduces_with_and_without_drafts(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    ids = ids_of(tiny_lm, PROMPTS[0])
    plain = alone(
        engine, GenerationRequest(prompt_ids=ids, params=SAMPLED, max_tokens=40, draft=False)
    )
    drafted = alone(engine, GenerationRequest(prompt_ids=ids, params=SAMPLED, max_tokens=40))
    other_seed = alone(
        engine,
        GenerationRequest(
            prompt_ids=ids, params=SamplingParams(temperature=0.9, top_k=20, seed=6), max_tokens=40
        ),
    )
    assert drafted == plain
    assert other_seed != plain  # the seed matters


def test_cancellation_frees_the_blocks_at_the_next_step(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    handles: list[Any] = []
    items: list[Any] = []

    def cancel_at_first_delta(item: Any) -> None:
        items.append(item)
        if isinstance(item, TextDelta) and len(items) == 1:
            handles[0].cancel()

    req = GenerationRequest(prompt_ids=ids_of(tiny_lm, PROMPTS[1]), max_tokens=200, draft=False)
    with engine._cond:  # the engine thread cannot take the request before the handle is kept
        handles.append(engine.submit(req, cancel_at_first_delta))
    assert engine.wait_idle(60)
    assert items[-1] is END
    assert not any(isinstance(i, GenerationStats) for i in items)
    assert len([i for i in items if isinstance(i, TextDelta)]) <= 2
    assert engine.pool.used() == 0


def test_a_prompt_beyond_the_pool_is_refused_naming_the_context(tiny_lm: LoadedModel) -> None:
    small = make_engine(tiny_lm, kv_cache_mb=64 * 1024 / 2**20)  # 8 blocks of 16 slots
    assert small.context_length == 128
    with pytest.raises(PromptTooLong, match="128 tokens"):
        small.submit(GenerationRequest(prompt_ids=[5] * 128), lambda item: None)


def test_a_full_queue_is_refused(tiny_lm: LoadedModel) -> None:
    busy = make_engine(tiny_lm, max_batch=1, max_queue=1)
    release = threading.Event()

    def hold(item: Any) -> None:  # keeps the engine thread in the first request's step
        release.wait(60)

    req = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=4, draft=False)
    busy.submit(req, hold)
    busy.submit(req, lambda item: None)
    with pytest.raises(EngineBusy):
        busy.submit(req, lambda item: None)
    release.set()
    assert busy.wait_idle(60)
    busy.submit(req, lambda item: None)  # room again
    assert busy.wait_idle(60)


def test_accepted_tokens_are_counted_by_the_source_they_came_from(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    prompt = ids_of(tiny_lm, PROMPTS[1])
    plain = GenerationRequest(prompt_ids=prompt, max_tokens=30, draft=False)
    want = alone(engine, plain)
    # the answer is in a document the corpus retrieved: the drafter copies it from there
    doc = ("retrieved-answer", np.asarray(prompt + want, np.uint32))
    req = GenerationRequest(
        prompt_ids=prompt, max_tokens=30, documents=[doc], document_sources=[Source.RETRIEVED]
    )
    sink = Collector()
    engine.submit(req, sink)
    assert engine.wait_idle(120)
    assert sink.ids == want
    by_source = sink.stats.accepted_by_source
    assert by_source.get("retrieved", 0) > 0
    assert "document" not in by_source
    assert sum(by_source.values()) == sink.stats.accepted_tokens
    drafted = sink.stats.drafted_by_source
    assert drafted["retrieved"] >= by_source["retrieved"]
    assert sum(drafted.values()) == sink.stats.drafted_tokens


def test_a_request_whose_drafts_never_pass_stops_drafting_and_retries_less_often(
    engine: Engine, tiny_lm: LoadedModel
) -> None:
    prompt = ids_of(tiny_lm, PROMPTS[2])
    want = alone(engine, GenerationRequest(prompt_ids=prompt, max_tokens=60, draft=False))
    drafter = OracleDrafter(want, tiny_lm.config.vocab_size, "wrong", eos=2)
    controller = PassThrough(k=4)
    sink = Collector()
    engine.submit(
        GenerationRequest(prompt_ids=prompt, max_tokens=60),
        sink,
        drafter=drafter,
        controller=controller,
    )
    assert engine.wait_idle(60)
    assert sink.ids == want
    drafted = [step for step, (rows, _) in enumerate(controller.observed) if rows]
    assert all(accepted == 0 for _, accepted in controller.observed)
    # each 4-row draft of score 1 misses more than PATIENCE expected tokens: the request
    # rests after it, 4 steps, then 8, then 16 steps (REST doubles after a failed retry)
    assert drafted == [0, 5, 14, 31]
    assert drafter.calls == len(drafted)  # a resting request is not even asked for a draft
