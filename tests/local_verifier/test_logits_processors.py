"""Penalties, logit_bias and min_p: the formulas, tree rows, and plain == speculative."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from spec_drafts import OracleDrafter, PassThrough
from test_batching import make_engine

from local_verifier.engine import Engine, GenerationRequest, TextDelta
from local_verifier.loader import LoadedModel
from local_verifier.logits_processors import Penalties, PenaltyState
from local_verifier.sampling import SamplingParams, target_probs
from local_verifier.testing.penalties import adjust

V = 10


def _logits() -> torch.Tensor:
    return torch.randn(V, generator=torch.Generator().manual_seed(3)) * 3


def test_frequency_and_presence_follow_openai_formula() -> None:
    logits = _logits()
    pen = Penalties(presence_penalty=0.7, frequency_penalty=0.3)
    output = [3, 3, 4, 3, 9]
    got = adjust(logits, pen, prompt=[1, 2], output=output)
    for t in range(V):
        count = output.count(t)
        want = logits[t] - (torch.tensor(float(count)) * 0.3 + float(count > 0) * 0.7)
        assert torch.equal(got[t], want), t
    assert torch.equal(got[[0, 1, 2, 5, 6, 7, 8]], logits[[0, 1, 2, 5, 6, 7, 8]])


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([2.0, -2.0, 1.5, -0.5, 4.0, 3.0, -1.0, 0.0, 1.0, 2.5])
    got = adjust(logits, Penalties(repetition_penalty=1.25), prompt=[0, 1], output=[2, 3, 2])
    seen = {0, 1, 2, 3}
    for t in range(V):
        value = logits[t]
        want = (value / 1.25 if value > 0 else value * 1.25) if t in seen else value
        assert torch.equal(got[t], want), t


def test_logit_bias_adds_to_the_named_tokens() -> None:
    logits = _logits()
    got = adjust(logits, Penalties(logit_bias={4: -100.0, 7: 2.5}), prompt=[], output=[])
    assert torch.equal(got[4], logits[4] - 100.0) and torch.equal(got[7], logits[7] + 2.5)
    others = [t for t in range(V) if t not in (4, 7)]
    assert torch.equal(got[others], logits[others])


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability() -> None:
    logits = _logits()
    probs = torch.softmax(logits / 0.7, -1)
    got = target_probs(logits, SamplingParams(temperature=0.7, min_p=0.2))
    kept = probs >= 0.2 * probs.max()
    assert 1 < int(kept.sum()) < V
    assert torch.equal(got > 0, kept)
    assert torch.equal(got, torch.softmax((logits / 0.7).masked_fill(~kept, -torch.inf), -1))


def _state(pen: Penalties, prompt: list[int], output: list[int]) -> PenaltyState:
    return PenaltyState(pen, [*prompt, *output], len(prompt), V, torch.device("cpu"))


ALL = Penalties(
    presence_penalty=0.5, frequency_penalty=0.4, repetition_penalty=1.3, logit_bias={5: 2.0}
)


def test_each_tree_row_uses_committed_tokens_plus_its_own_ancestors() -> None:
    rows = torch.randn(6, V, generator=torch.Generator().manual_seed(1))
    tokens, parents = [5, 6, 5, 7, 5], [-1, -1, 0, 1, 2]
    got = _state(ALL, [1, 2], [3, 5]).rows(rows, tokens, parents)
    paths = [[], [5], [6], [5, 5], [6, 7], [5, 5, 5]]
    for row, path in enumerate(paths):
        assert torch.equal(got[row], adjust(rows[row], ALL, [1, 2], [3, 5, *path]))


def test_committed_tokens_update_the_state_like_a_fresh_one() -> None:
    """Tokens committed step by step give the bits of a state built on the whole history,
    and a step's draft paths never leak into the committed state."""
    rows = torch.randn(3, V, generator=torch.Generator().manual_seed(2))
    state = _state(ALL, [1, 2], [])
    state.rows(rows, [8, 9], [-1, 0])  # a draft path, rejected
    for new in ([3], [5, 3], [0]):
        state.commit(new)
    fresh = _state(ALL, [1, 2], [3, 5, 3, 0])
    assert torch.equal(state.rows(rows, [4, 4], [-1, 0]), fresh.rows(rows, [4, 4], [-1, 0]))
    assert torch.equal(
        state.rows(rows[:1], [], []), adjust(rows[0], ALL, [1, 2], [3, 5, 3, 0])[None]
    )


def test_a_row_does_not_depend_on_the_other_rows_of_its_step() -> None:
    rows = torch.randn(4, V, generator=torch.Generator().manual_seed(4))
    state = _state(ALL, [1, 2], [3])
    alone = state.rows(rows[:1], [], [])
    assert torch.equal(state.rows(rows, [5, 6, 7], [-1, 0, 1])[:1], alone)
    # node 6 after the root: the same row in a chain of one and beside a sibling
    chain = state.rows(rows[:2], [6], [-1])[1]
    beside = state.rows(torch.stack([rows[0], rows[3], rows[1]]), [9, 6], [-1, -1])[2]
    assert torch.equal(chain, beside)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": float("nan")},
        {"repetition_penalty": 0.0},
        {"logit_bias": {3: 101.0}},
        {"logit_bias": {-1: 1.0}},
    ],
)
def test_bad_values_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Penalties(**kwargs)


# --- through the engine on the tiny model ------------------------------------------------

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
PENALTIES = Penalties(
    presence_penalty=0.6, frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={5: 3.0}
)


@pytest.fixture(scope="module")
def engine(tiny_lm: LoadedModel) -> Engine:
    return make_engine(tiny_lm)


def _ids(engine: Engine, req: GenerationRequest, drafter: Any = None) -> list[int]:
    items = engine.generate(req, drafter=drafter, controller=PassThrough() if drafter else None)
    return [t for i in items if isinstance(i, TextDelta) for t in i.token_ids]


@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=0.9, min_p=0.05, seed=4)],
    ids=["greedy", "seeded"],
)
@pytest.mark.parametrize("mode", ["partly", "tree"])
def test_penalised_answer_with_drafts_equals_plain(
    engine: Engine, tiny_lm: LoadedModel, params: SamplingParams, mode: str
) -> None:
    prompt_ids = list(tiny_lm.tokenizer.encode(PROMPT))
    req = GenerationRequest(
        prompt_ids=prompt_ids, params=params, max_tokens=40, penalties=PENALTIES, draft=False
    )
    plain = _ids(engine, req)
    unpenalised = _ids(engine, GenerationRequest(**{**req.__dict__, "penalties": Penalties()}))
    assert plain != unpenalised  # the penalties change the answer
    drafter = OracleDrafter(plain, tiny_lm.config.vocab_size, mode, eos=2)
    drafted = _ids(engine, GenerationRequest(**{**req.__dict__, "draft": True}), drafter)
    assert drafted == plain
    assert drafter.calls > 0


def test_banned_token_never_appears(engine: Engine, tiny_lm: LoadedModel) -> None:
    prompt_ids = list(tiny_lm.tokenizer.encode(PROMPT))
    params = SamplingParams(temperature=1.0, seed=0)
    free = _ids(engine, GenerationRequest(prompt_ids=prompt_ids, params=params, max_tokens=60))
    banned = max(set(free), key=free.count)
    for seed in range(5):
        req = GenerationRequest(
            prompt_ids=prompt_ids,
            params=SamplingParams(temperature=1.0, seed=seed),
            max_tokens=60,
            penalties=Penalties(logit_bias={banned: -100.0}),
        )
        drafter = OracleDrafter(free, tiny_lm.config.vocab_size, "right", eos=2)
        assert banned not in _ids(engine, req, drafter)
