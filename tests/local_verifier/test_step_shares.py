"""Tenants share each step by what their rows cost: decode turns and drafts within each
tenant's allowance (the busiest other tenant's demand, or a share of the step's fixed
part) and what it banked; rows priced by their context; on the tiny model a row at a long
context decodes in fewer steps beside short ones, with the same tokens."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from arrivals import together
from spec_drafts import OracleDrafter, PassThrough
from step_records import cost, owners, record_steps

from local_verifier.config import ModelConfig
from local_verifier.engine import Engine, GenerationRequest
from local_verifier.loader import LoadedModel
from local_verifier.row_prices import RowPrice
from local_verifier.step_shares import StepShares


@dataclass(eq=False)
class Answer:
    owner: str
    weight: float = 1.0
    name: str = ""
    turn: int = 0
    cost: float = 1.0  # a pending row's seconds


def turns(
    answers: list[Answer],
    steps: int,
    fixed: float = 0.0,
    shares: StepShares | None = None,
    prefilling: list[Answer] | None = None,
) -> list[list[str]]:
    """The names decoding in each of ``steps`` steps (no drafts), each stamping its turn
    and spending what it decodes, as the step runner does."""
    shares = StepShares() if shares is None else shares
    out = []
    for step in range(1, steps + 1):
        chosen = shares.turns(answers, prefilling or [], lambda a: a.cost, fixed)
        for a in chosen:
            a.turn = step
        shares.drafts(
            [a.owner for a in chosen],
            [0] * len(chosen),
            [a.cost for a in chosen],
            [1.0] * len(chosen),
        )
        out.append([a.name for a in chosen])
    return out


def test_a_tenant_alone_decodes_every_answer() -> None:
    answers = [Answer("a", name=f"a{i}", cost=5.0) for i in range(5)]
    assert turns(answers, 2) == [[f"a{i}" for i in range(5)]] * 2


def test_many_answers_take_turns_beside_another_tenant() -> None:
    answers = [Answer("abuser", name=f"x{i}") for i in range(5)]
    answers += [Answer("honest", name="h0"), Answer("honest", name="h1")]
    # rows of equal cost: the abuser decodes as many as the honest tenant, in turn
    assert turns(answers, 3) == [
        ["x0", "x1", "h0", "h1"],
        ["x2", "x3", "h0", "h1"],
        ["x0", "x4", "h0", "h1"],  # in the running order
    ]


def test_a_dear_row_decodes_in_fewer_steps() -> None:
    """A row costing four of the other tenant's two rows' worth waits, banking its share,
    and decodes every other step: over the steps it costs no more than the other."""
    answers = [Answer("long", name="l", cost=4.0)]
    answers += [Answer("short", name="s0"), Answer("short", name="s1")]
    assert turns(answers, 4) == [["s0", "s1"], ["l", "s0", "s1"]] * 2


def test_decode_shares_follow_the_weights() -> None:
    answers = [Answer("a", 2.0, f"a{i}") for i in range(6)] + [Answer("b", 1.0, "b0")]
    assert turns(answers, 1) == [["a0", "a1", "b0"]]
    # a quarter of a row a step: one of a's answers every fourth step
    answers = [Answer("a", 1.0, f"a{i}") for i in range(6)] + [Answer("b", 4.0, "b0")]
    assert turns(answers, 8) == [["b0"]] * 3 + [["a0", "b0"]] + [["b0"]] * 3 + [["a1", "b0"]]


def test_no_tenant_is_held_below_its_share_of_the_fixed_part() -> None:
    """Beside one cheap row, a tenant still decodes its weighted share of half the step's
    fixed seconds (the other's steps grow by at most a quarter), the cheap one too."""
    answers = [Answer("many", name=f"m{i}") for i in range(10)] + [Answer("one", name="o")]
    assert turns(answers, 1, fixed=16.0) == [["m0", "m1", "m2", "m3", "o"]]
    assert turns(answers, 1, fixed=0.0) == [["m4", "o"]]  # without one: the other's row


def test_a_tenant_waiting_for_its_first_token_shares_the_step() -> None:
    """A tenant whose requests are all in prefill counts one row each beside the decoding
    ones, so the step with its prompt carries that share of the others' rows (and no
    share of the fixed part)."""
    abuser = [Answer("abuser", name=f"x{i}") for i in range(16)]
    assert len(turns(abuser, 1)[0]) == 16
    assert turns(abuser, 1, prefilling=[Answer("honest")]) == [["x0"]]
    two = [Answer("honest"), Answer("honest")]
    assert turns(abuser, 1, prefilling=two) == [["x0", "x1"]]
    # no share of the fixed part then: beside decoding ones it would be 4 of these rows
    assert turns(abuser, 1, fixed=16.0, prefilling=two) == [["x0", "x1"]]
    # a tenant alone, or prefilling beside nobody decoding, changes nothing
    assert turns(abuser, 1, prefilling=[Answer("abuser")])[0] == [a.name for a in abuser]
    assert turns([], 1, prefilling=two) == [[]]


def test_a_row_dearer_than_any_bank_still_decodes() -> None:
    answers = [Answer("long", name="l", cost=50.0), Answer("short", name="s")]
    steps = turns(answers, 110, fixed=2.0)  # an allowance of 1 a step, banks of 2 ...
    decoded = [i for i, names in enumerate(steps) if "l" in names]
    assert decoded == [49, 99]  # ... but of one row where that costs more
    assert all("s" in names for names in steps)


def test_drafts_are_cut_longest_first_to_the_allowance() -> None:
    shares = StepShares()
    a = [Answer("a", name="a0"), Answer("a", name="a1")]
    b = [Answer("b", name=f"b{i}", cost=2.0) for i in range(3)]
    assert shares.turns([*a, *b], [], lambda r: r.cost, 0.0) == [*a, b[0]]
    # a's 1 + 8 and 1 + 2 rows beside b's 2 + 5 (b asked 6): cut to 1 + 3 and 1 + 2
    assert shares.drafts(["a", "a", "b"], [8, 2, 5], [1.0, 1.0, 2.0], [1.0] * 3) == [3, 2, 5]
    # b spent 7 of a's 12 (before the cut): it banks up to its dearest row
    assert shares.bank == {"a": 0.0, "b": 2.0}


def test_a_bank_lets_a_tenant_burst_by_what_it_saved() -> None:
    shares = StepShares(burst=2.0)
    a = Answer("a", name="a")
    b = [Answer("b", name=f"b{i}") for i in range(3)]
    for _ in range(3):  # a spends 1 of the 3 b asks a step: it saves up to 2 fixed parts
        chosen = shares.turns([a, *b], [], lambda r: r.cost, 2.0)
        assert [r.name for r in chosen] == ["a", "b0"]  # b: a's 1 (its floor: a half)
        shares.drafts(["a", "b"], [0, 0], [1.0, 1.0], [1.0, 1.0])
    assert shares.bank["a"] == 4.0 and shares.bank["b"] == 0.0
    # not in a step that computes a prompt (b's third request): b's two rows alone
    shares.turns([a, *b[:2]], [b[2]], lambda r: r.cost, 2.0)
    assert shares.drafts(["a", "b"], [10, 0], [1.0, 1.0], [1.0, 1.0]) == [1, 0]
    assert shares.bank["a"] == 4.0
    shares.turns([a, *b], [], lambda r: r.cost, 2.0)
    # a's draft of 10 rows: within b's 3 and the 4 it saved, its pending row included
    assert shares.drafts(["a", "b"], [10, 0], [1.0, 1.0], [1.0, 1.0]) == [6, 0]
    assert shares.bank["a"] == 0.0


def test_prompt_chunks_cost_at_most_the_others_step_alone() -> None:
    """Beside b's decode row (cost 1, fixed part 4) a's prompt chunks may cost b's step
    alone, 5, less a's own decode rows; with weights 2:1, twice that; with no one else
    decoding or ending a prompt, no cost cap (rows alone)."""
    shares = StepShares()
    a, b = Answer("a", cost=1.0), Answer("b", cost=1.0)
    shares.turns([b], [a], lambda r: r.cost, 4.0)
    assert shares.prompt_allowances(["a", "b"], {}) == {"a": 5.0, "b": None}
    shares.turns([a, b], [a], lambda r: r.cost, 4.0)  # a decodes one row too
    assert shares.prompt_allowances(["a"], {}) == {"a": 4.0}
    heavy = Answer("a", weight=2.0, cost=1.0)
    shares.turns([b], [heavy], lambda r: r.cost, 4.0)
    assert shares.prompt_allowances(["a"], {}) == {"a": 10.0}
    shares.turns([], [a, b], lambda r: r.cost, 4.0)  # both compute prompts
    assert shares.prompt_allowances(["a", "b"], {}) == {"a": None, "b": None}
    # b's prompt ends in this step (chunks of 3): a's may cost its step, 4 + 3
    assert shares.prompt_allowances(["a", "b"], {"b": 3.0}) == {"a": 7.0, "b": None}


def test_a_chunk_takes_the_rows_its_seconds_buy() -> None:
    price = RowPrice(read_share=1e-3, row_tokens=500.0).with_table([3.0, 3.0, 4.0, 5.0])
    for start in (0, 100, 4000):
        for seconds in (0.5, 3.0, 40.0, 1e6):
            n = price.chunk_rows(start, 64, seconds)
            assert n == 64 or price.seq(n + 1, start + n + 1) > seconds
            assert n == 0 or price.seq(n, start + n) <= seconds
    assert price.chunk_rows(4000, 64, 1e6) == 64
    assert price.chunk_rows(0, 64, 0.5) == 0


def test_rows_are_priced_by_their_context() -> None:
    table = [3.0, 3.0, 4.0, 5.0]  # a fixed part of 2 and a row of 1
    price = RowPrice(read_share=1e-3, row_tokens=500.0).with_table(table)
    assert (price.row_s, price.fixed_s) == (1.0, 2.0)
    assert price.row(500) == 2.0  # a row computing over 500 context tokens
    assert price.seq(1, 500) == 2.0 + 1.0  # and reading them: 2 x 500 x 1e-3
    assert price.seq(4, 500) == 4 * 2.0 + 1.0  # read once for the sequence


def test_a_context_token_costs_its_bytes_of_the_fixed_part() -> None:
    """SmolLM2-135M's shape with bf16 weights and K/V: a token's K/V read is 23,040 bytes
    of the weights' 269 MB; its products, a 1,557th of a row's."""
    cfg = ModelConfig(49152, 576, 30, 9, 3, 64, 1536)
    model = SimpleNamespace(config=cfg)  # no tensors: 4 bytes a product
    price = RowPrice.for_model(model, 23040)
    assert 1550 < price.row_tokens < 1560
    assert price.read_share == 23040 / (4 * 134_479_872)
    model = torch.nn.Linear(1000, 1000, bias=False).to(torch.bfloat16)
    model.config = cfg  # type: ignore[assignment]
    assert RowPrice.for_model(model, 100).read_share == 100 / 2_000_000  # its weights' bytes


# -- on the engine ---------------------------------------------------------------------------


def make_engine(lm: LoadedModel, **kw: Any) -> Engine:
    """Steps of a small fixed part (one row's seconds) and rows of 0.1 ms, as given."""
    costs = [1e-4 * (1 + r) for r in range(32 + 8 + 1)]
    return Engine(lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=4, **kw)


def test_a_long_context_decodes_in_fewer_steps_with_the_same_tokens(
    tiny_lm: LoadedModel,
) -> None:
    engine = make_engine(tiny_lm)
    price = engine._scheduler.runner.price
    assert price.seq(1, 200) > 2 * price.seq(1, 10)  # the tiny model's context is dear
    long_prompt = [5 + i % 200 for i in range(200)]
    long = GenerationRequest(prompt_ids=long_prompt, max_tokens=24, draft=False, owner="long")
    alone: list[int] = []
    engine.submit(long, lambda item: alone.extend(getattr(item, "token_ids", [])))
    assert engine.wait_idle(60)
    steps = record_steps(engine)
    beside: list[int] = []
    short = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=24, draft=False, owner="short")
    with together(engine):
        engine.submit(short, lambda _: None)
        engine.submit(long, lambda item: beside.extend(getattr(item, "token_ids", [])))
    assert engine.wait_idle(60)
    shared = [s for s in steps if owners(s) == {"long", "short"}]
    apart = [s for s in steps if owners(s) == {"short"}]
    assert len(shared) >= 3 and len(apart) >= len(shared)  # it skipped steps ...
    # ... costing over the steps no more than the short row beside it, and its one row
    dearest = price.seq(1, 224)
    spent = sum(cost(s, "long", price) for s in shared)
    assert spent <= sum(cost(s, "short", price) for s in [*shared, *apart]) + dearest
    assert beside == alone  # to the same tokens
    engine.close()


def test_one_tenants_drafts_cost_no_more_than_the_others_rows(tiny_lm: LoadedModel) -> None:
    engine = make_engine(tiny_lm)
    price = engine._scheduler.runner.price
    prompt = [5, 6, 7, 8]
    want: list[int] = []
    engine.submit(
        GenerationRequest(prompt_ids=prompt, max_tokens=40, draft=False),
        lambda item: want.extend(getattr(item, "token_ids", [])),
    )
    assert engine.wait_idle(60)
    steps = record_steps(engine)
    short = GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=16, draft=False, owner="b")
    answers: list[list[int]] = [[] for _ in range(3)]
    with together(engine):
        engine.submit(short, lambda _: None)
        for i in range(3):  # tenant a: three answers drafting 8 right tokens every step
            engine.submit(
                GenerationRequest(prompt_ids=prompt, max_tokens=40, owner="a"),
                lambda item, i=i: answers[i].extend(getattr(item, "token_ids", [])),
                drafter=OracleDrafter(want, tiny_lm.config.vocab_size, "right", eos=2),
                controller=PassThrough(k=8),
            )
    assert engine.wait_idle(60)
    shared = [s for s in steps if owners(s) == {"a", "b"}]
    assert len(shared) >= 4
    # a: b's row or a quarter of the fixed part (a quarter row) a step, and what it saved
    fixed = price.row_s
    allowed = sum(max(cost(s, "b", price), fixed / 4) for s in shared)
    assert sum(cost(s, "a", price) for s in shared) <= allowed + fixed + price.seq(1, 44)
    assert max(sum(1 + k for o, k, _ in s if o == "a") for s in steps) == 27  # alone: 3 x 9
    assert answers == [want] * 3  # cut drafts change no answer
    engine.close()


def test_a_long_prompt_beside_anothers_answer_costs_no_more_than_its_step(
    tiny_lm: LoadedModel,
) -> None:
    """b decodes while a computes a 220-token prompt: in every step with b's row, a's
    chunk costs at most b's step alone (or is one row), so a's prompt takes more steps
    instead of making b's slow; both answers are the ones they give alone."""
    engine = make_engine(tiny_lm, prefix_cache=False)  # a's prompt computed again beside b
    runner = engine._scheduler.runner
    reqs = {
        "b": GenerationRequest(prompt_ids=[9, 8, 7], max_tokens=24, draft=False, owner="b"),
        "a": GenerationRequest(
            prompt_ids=[5 + i % 200 for i in range(220)], max_tokens=4, draft=False, owner="a"
        ),
    }
    alone: dict[str, list[int]] = {}
    for name, req in reqs.items():
        alone[name] = []
        engine.submit(req, lambda item, n=name: alone[n].extend(getattr(item, "token_ids", [])))
        assert engine.wait_idle(60)
    chunks: list[tuple[int, int, bool]] = []  # a's chunks: start, end, whether b decodes
    chunk = runner._chunk

    def recorded(req: Any, end: int) -> Any:
        running = engine._scheduler.places.running
        b_decodes = any(r.owner == "b" and not r.prefilling for r in running)
        if req.owner == "a":
            chunks.append((req.computed, end, b_decodes))
        return chunk(req, end)

    runner._chunk = recorded  # type: ignore[method-assign]
    beside: dict[str, list[int]] = {"a": [], "b": []}
    with together(engine):
        for name in ("b", "a"):
            engine.submit(
                reqs[name], lambda item, n=name: beside[n].extend(getattr(item, "token_ids", []))
            )
    assert engine.wait_idle(60)
    price = runner.price.with_table(runner.costs.table)
    step_b = price.fixed_s + price.seq(1, 30)  # b's step alone, at its longest context
    shared = [(start, end) for start, end, b in chunks if b]
    assert len(shared) >= 3  # a's prompt went on beside b's answer ...
    assert all(end - start == 1 or price.seq(end - start, end) <= step_b for start, end in shared)
    apart = [end - start for start, end, b in chunks if not b]
    assert apart and max(apart) > max(end - start for start, end in shared)
    assert beside == alone  # ... and neither answer changed
    engine.close()
