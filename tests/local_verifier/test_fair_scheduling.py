"""Tenants share the engine fairly: deficit round robin over per-tenant queues (weights,
a blocked tenant passed over, carried prefill shares), per-tenant places, and on the tiny
model an ``n > 1`` request's answers and a tenant's backlog never queue ahead of another
tenant's request (the shares of each step's cost: ``test_step_shares``)."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from arrivals import together
from spec_drafts import OracleDrafter, PassThrough
from step_records import record_steps

from local_verifier.engine import END, Engine, GenerationRequest, TextDelta
from local_verifier.errors import TenantBusy
from local_verifier.fair_queue import FairQueue, split
from local_verifier.kv_pool import DEFAULT_BLOCK_SIZE
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.logits_processors import Penalties
from tests.local_verifier.collect import Collector


@dataclass(eq=False)
class Item:
    owner: str
    weight: float = 1.0
    name: str = ""


def drain(queue: FairQueue[Item], admissible: Any = lambda item: True) -> list[str]:
    order = []
    while (item := queue.pop(admissible)) is not None:
        order.append(item.name)
    return order


def test_tenants_take_turns_by_weight() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.extend(Item("a", 1.0, f"a{i}") for i in range(6))
    queue.extend(Item("b", 2.0, f"b{i}") for i in range(6))
    queue.extend(Item("c", 0.5, f"c{i}") for i in range(2))
    # per round: a is admitted once, b twice, c every other round
    assert drain(queue) == [
        *("a0", "b0", "b1"),
        *("a1", "b2", "b3", "c0"),
        *("a2", "b4", "b5"),
        *("a3", "c1"),
        *("a4", "a5"),
    ]


def test_a_blocked_tenant_does_not_block_the_others() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.append(Item("big", name="huge"))
    queue.extend(Item("small", name=f"s{i}") for i in range(3))
    assert drain(queue, lambda item: item.name != "huge") == ["s0", "s1", "s2"]
    assert len(queue) == 1 and queue.pop(lambda item: True) is not None


def test_front_places_stay_within_the_tenant() -> None:
    queue: FairQueue[Item] = FairQueue()
    queue.append(Item("a", name="a-later"))
    queue.append(Item("b", name="b0"))
    queue.append(Item("a", name="a-answer-1"), front=True)
    assert drain(queue) == ["a-answer-1", "b0", "a-later"]


def test_prefill_budget_is_shared_by_weight_and_what_is_left_goes_on() -> None:
    credit: dict[str, float] = {}
    weights = {"a": 1.0, "b": 3.0}
    assert split(64, {"a": 1000, "b": 1000}, weights, credit) == {"a": 16, "b": 48}
    assert split(64, {"a": 1000, "b": 10}, weights, credit) == {"a": 54, "b": 10}
    assert "b" in credit and credit["b"] == 0.0  # no backlog: nothing carried
    assert split(64, {"a": 1000}, weights, credit) == {"a": 64}
    assert "b" not in credit  # a tenant with nothing to prefill keeps no credit


def test_what_a_tenant_leaves_goes_on_only_up_to_the_others_caps() -> None:
    weights = {"a": 1.0, "b": 1.0}
    # b decodes and prefills nothing: a's prompt takes at most its cap, not the whole budget
    assert split(64, {"a": 1000}, weights, {}, caps={"a": 32, "b": 32}) == {"a": 32}
    # the weighted share itself is never cut, whatever the cap
    assert split(64, {"a": 1000, "b": 1000}, weights, {}, caps={"a": 8, "b": 8}) == {
        "a": 32,
        "b": 32,
    }
    # b leaves 22 of its 32: a takes them only up to its cap of 40
    assert split(64, {"a": 1000, "b": 10}, weights, {}, caps={"a": 40}) == {"a": 40, "b": 10}


# -- on the engine ---------------------------------------------------------------------------


NO_END = Penalties(logit_bias={0: -100.0, 1: -100.0, 2: -100.0})  # answers run their length


def make_engine(lm: LoadedModel, **kw: Any) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    return Engine(lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=4, **kw)


class FirstTokens:
    """The order in which requests delivered their first token (on the engine thread)."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def on(self, name: str) -> Any:
        def item(value: Any) -> None:
            if isinstance(value, TextDelta) and value.token_ids and name not in self.order:
                self.order.append(name)

        return item


def test_another_tenants_request_is_not_queued_behind_a_backlog(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm, max_batch=1)
    release = threading.Event()
    seen = FirstTokens()
    first = seen.on("a0")

    def hold(item: Any) -> None:  # the engine waits in a0's first step until all are queued
        first(item)
        release.wait(60)

    req = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=3, draft=False, owner="a")
    engine.submit(req, hold)
    for i in range(1, 5):
        engine.submit(req, seen.on(f"a{i}"))
    answers = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=3, draft=False, owner="c")
    engine.submit_n(answers, 3, lambda i, item: seen.on(f"c.{i}")(item))
    engine.submit(
        GenerationRequest(prompt_ids=[5, 9], max_tokens=3, draft=False, owner="b"), seen.on("b")
    )
    release.set()
    assert engine.wait_idle(60)
    order = seen.order
    assert len(order) == 9
    # first in, but a's backlog and c's extra answers take turns with b
    assert order.index("b") < order.index("a3")
    assert order.index("b") < order.index("c.2")
    assert order.index("a1") < order.index("a2") < order.index("a3") < order.index("a4")
    engine.close()


def test_one_tenant_cannot_take_every_place(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm, max_batch=1, max_queue=8, tenant_places=3)
    release = threading.Event()
    req = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=2, draft=False, owner="a")
    engine.submit(req, lambda item: release.wait(60))
    engine.submit_n(req, 2, lambda i, item: None)
    with pytest.raises(TenantBusy):
        engine.submit(req, lambda item: None)
    other = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=2, draft=False, owner="b")
    engine.submit_n(other, 3, lambda i, item: None)  # another tenant still has its places
    release.set()
    assert engine.wait_idle(60)
    engine.submit_n(req, 3, lambda i, item: None)  # its places are free again
    assert engine.wait_idle(60)
    engine.close()


def test_a_full_batch_makes_room_for_a_tenant_below_its_share(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm, max_batch=4)
    long = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=80, draft=False, owner="a")
    alone: list[list[int]] = [[] for _ in range(4)]
    engine.submit_n(long, 4, lambda i, item: alone[i].extend(getattr(item, "token_ids", [])))
    assert engine.wait_idle(60)
    events: list[str] = []
    started, queued = threading.Event(), threading.Event()
    ids: list[list[int]] = [[] for _ in range(4)]

    def on_a(i: int, item: Any) -> None:
        ids[i].extend(getattr(item, "token_ids", []))
        if item is END:
            events.append(f"a{i} end")
        if all(ids) and not started.is_set():  # the engine waits here until b is queued
            started.set()
            queued.wait(60)

    engine.submit_n(long, 4, on_a)  # every place of the batch
    assert started.wait(60)
    short = GenerationRequest(prompt_ids=[9, 8], max_tokens=4, draft=False, owner="b")
    engine.submit(short, lambda item: events.append("b end") if item is END else None)
    queued.set()
    assert engine.wait_idle(120)
    assert events.index("b end") < min(events.index(f"a{i} end") for i in range(4))
    assert engine.stats().preemptions >= 1  # one of a's answers gave b its place ...
    assert ids == alone  # ... and came back to the same tokens
    engine.close()


def test_each_tenants_drafts_stay_within_its_share_of_a_step(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm)  # a token budget of 32 a step: 16 draft rows per tenant
    prompt = [5, 6, 7, 8]
    want: list[int] = []
    engine.submit(
        GenerationRequest(prompt_ids=prompt, max_tokens=40, draft=False),
        lambda item: want.extend(getattr(item, "token_ids", [])),
    )
    assert engine.wait_idle(60)
    rows = record_steps(engine)
    answers: list[list[int]] = [[] for _ in range(3)]
    with together(engine):
        for i in range(3):  # tenant a: three answers drafting 8 right tokens every step
            drafter = OracleDrafter(want, tiny_lm.config.vocab_size, "right", eos=2)
            engine.submit(
                GenerationRequest(prompt_ids=prompt, max_tokens=40, owner="a"),
                lambda item, i=i: answers[i].extend(getattr(item, "token_ids", [])),
                drafter=drafter,
                controller=PassThrough(k=8),
            )
        b = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=3, owner="b")
        engine.submit(b, lambda _: None)
    assert engine.wait_idle(60)
    shared = [step for step in rows if {o for o, _, _ in step} == {"a", "b"}]
    assert shared  # the tenants decoded side by side
    assert all(sum(k for o, k, _ in step if o == "a") <= 16 for step in shared)
    assert max(sum(k for o, k, _ in step if o == "a") for step in rows) > 16  # alone: more
    assert answers == [want] * 3  # cut drafts change no answer
    engine.close()


def test_a_full_pool_gives_blocks_back_to_a_tenant_below_its_share(tiny_lm: LoadedModel) -> None:
    """Tenant a's three long prompts fill the pool; b's short request takes blocks back
    from a (its latest answer preempted) at once rather than wait for one of a's answers
    to end, and every answer is the one it gets alone."""
    long = [GenerationRequest(prompt_ids=[5 + (i + j) % 50 for j in range(100)], max_tokens=12, draft=False, owner="a") for i in range(3)]  # fmt: skip
    short = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=4, draft=False, owner="b")
    alone = _alone(tiny_lm, [*long, short])
    # a's three answers hold 21 blocks and leave too few for b's (one and one per running answer)
    engine = _tight(tiny_lm, 24)
    events: list[str] = []
    started, queued = threading.Event(), threading.Event()
    answers = [Collector() for _ in range(4)]

    def on_a(i: int, item: Any) -> None:
        answers[i](item)
        if item is END:
            events.append(f"a{i} end")
        if isinstance(item, TextDelta) and f"a{i} first" not in events:
            events.append(f"a{i} first")
            if sum(e.endswith("first") for e in events) == 3:  # all three hold their blocks:
                started.set()  # the engine waits here until b is queued
                queued.wait(60)

    with together(engine):
        for i, req in enumerate(long):
            engine.submit(req, functools.partial(on_a, i))
    assert started.wait(60)

    def on_b(item: Any) -> None:
        answers[3](item)
        if isinstance(item, TextDelta) and "b first" not in events:
            events.append("b first")

    engine.submit(short, on_b)
    queued.set()
    assert engine.wait_idle(120)
    assert events.index("b first") < min(events.index(f"a{i} end") for i in range(3))
    assert engine.stats().preemptions >= 1  # one of a's answers gave b its blocks ...
    assert [a.ids for a in answers] == alone  # ... and came back to the same tokens
    engine.close()


def test_a_tenants_cache_within_its_share_survives_another_tenants_growth(
    tiny_lm: LoadedModel,
) -> None:
    """b's prompt is cached; while b still answers, a's three long prompts need more than
    the free blocks, and a already holds its share of the pool. a's third waits for a's own
    blocks rather than take b's cached prompt: b asking it again finds it whole, and every
    answer is the one it gets alone."""
    cached = GenerationRequest(prompt_ids=[7 + j % 40 for j in range(129)], max_tokens=1, draft=False, tenant="b", owner="b")  # fmt: skip
    running = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=120, penalties=NO_END, draft=False, tenant="b", owner="b")  # fmt: skip
    long = [GenerationRequest(prompt_ids=[5 + (i + j) % 50 for j in range(96)], max_tokens=12, penalties=NO_END, draft=False, tenant="a", owner="a") for i in range(3)]  # fmt: skip
    alone = _alone(tiny_lm, [cached, running, *long, cached])
    # b: 8 cached, 1-3 held; a's prompts 6 each: the third fits only by taking b's cached
    # blocks, which a, holding its share (12), may not
    engine = _tight(tiny_lm, 24)
    answers = [Collector() for _ in range(6)]
    ended: set[int] = set()
    a_done, asked = threading.Event(), threading.Event()

    def on_a(i: int, item: Any) -> None:
        answers[2 + i](item)
        if item is END:
            ended.add(i)

    def on_running(item: Any) -> None:
        answers[1](item)
        if len(ended) == 3 and not a_done.is_set():  # b still answers: the engine waits
            a_done.set()  # here until b asks for its cached prompt again
            asked.wait(60)

    engine.submit(cached, answers[0])
    assert engine.wait_idle(60)
    with together(engine):
        engine.submit(running, on_running)
        for i, req in enumerate(long):
            engine.submit(req, functools.partial(on_a, i))
    assert a_done.wait(60)
    engine.submit(cached, answers[5])
    asked.set()
    assert engine.wait_idle(120)
    assert answers[5].stats.cached_tokens == 128  # b's cached prompt is whole
    assert [a.ids for a in answers] == alone
    engine.close()


def test_a_request_preempted_for_another_tenant_waits_for_the_next_step(
    tiny_lm: LoadedModel,
) -> None:
    """a's three answers hold 18 of 24 blocks; b's prompt needs 15 and one block per
    running answer, more than one of a's answers gives back. Admission preempts a's latest
    for b once (a keeps its share); that answer, whose blocks are mostly cached, waits for
    the next step instead of taking them back in the same pass (which would make room for
    b again, preempt it again, and so on without end). b runs once a's answers end."""
    long = [GenerationRequest(prompt_ids=[5 + (i + j) % 50 for j in range(80)], max_tokens=24, penalties=NO_END, draft=False, owner="a") for i in range(3)]  # fmt: skip
    big = GenerationRequest(prompt_ids=[7 + j % 40 for j in range(240)], max_tokens=4, draft=False, owner="b")  # fmt: skip
    alone = _alone(tiny_lm, [*long, big])
    engine = _tight(tiny_lm, 24)
    answers = [Collector() for _ in range(4)]
    sent = [0, 0, 0]
    grown, queued = threading.Event(), threading.Event()

    def on_a(i: int, item: Any) -> None:
        answers[i](item)
        if isinstance(item, TextDelta):
            sent[i] += len(item.token_ids)
            if min(sent) >= 12 and not grown.is_set():  # each holds 6 blocks: the engine
                grown.set()  # waits here until b is queued
                queued.wait(60)

    with together(engine):
        for i, req in enumerate(long):
            engine.submit(req, functools.partial(on_a, i))
    assert grown.wait(60)
    engine.submit(big, answers[3])
    queued.set()
    assert engine.wait_idle(60)
    assert engine.stats().preemptions >= 1
    assert [a.ids for a in answers] == alone
    engine.close()


def _alone(lm: LoadedModel, reqs: list[GenerationRequest]) -> list[list[int]]:
    """Each request's answer on an engine of its own with room to spare, one at a time."""
    roomy = make_engine(lm)
    alone = []
    for req in reqs:
        answer = Collector()
        roomy.submit(req, answer)
        assert roomy.wait_idle(60)
        alone.append(answer.ids)
    roomy.close()
    return alone


def _tight(lm: LoadedModel, n_blocks: int) -> Engine:
    """An engine whose KV pool holds ``n_blocks`` blocks."""
    block = KVStorage.bytes_per_slot(lm.config, lm.model.kv_dtype) * DEFAULT_BLOCK_SIZE
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    engine = Engine(
        lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=n_blocks * block / 2**20
    )
    assert engine.pool.n_blocks == n_blocks
    return engine
