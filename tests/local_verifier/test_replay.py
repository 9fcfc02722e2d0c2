"""The offline replay serves recorded answers through the real scheduler, deterministically."""

from __future__ import annotations

from collections import Counter

import pytest

from local_verifier.hf_loader import read_tokenizer
from local_verifier.step_costs import LiveCosts
from local_verifier.tokenizer import Tokenizer
from tests.local_verifier.conftest import write_tiny_tokenizer
from tests.local_verifier.replay import Answer, StepCostTable, replay

COSTS = StepCostTable({1: 0.035, 4: 0.041, 16: 0.078, 64: 0.221})
CODE = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    write_tiny_tokenizer(directory)
    return read_tokenizer(directory)


def _answers(tok: Tokenizer) -> list[Answer]:
    """Answers that copy their prompt (drafts pay) and one that does not, one ending early."""
    copy = tok.encode(CODE * 3)
    other = tok.encode("The quick brown fox jumps over the lazy dog. 12345 67890")
    return [
        Answer("copy0", tok.encode("Repeat: " + CODE * 3), copy, len(copy)),
        Answer("copy1", tok.encode("Again: " + CODE * 3), copy, 64),  # ends with EOS
        Answer("other", tok.encode("Say something."), other, len(other)),
    ]


def test_step_costs_interpolate_and_extend_the_last_slope() -> None:
    assert COSTS(1) == COSTS(0) == 0.035
    assert COSTS(10) == pytest.approx(0.041 + 6 * (0.078 - 0.041) / 12)
    assert COSTS(96) == pytest.approx(0.221 + 32 * (0.221 - 0.078) / 48)
    assert COSTS.table(3) == [0.035, 0.035, COSTS(2), COSTS(3)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_drafts_reproduce_the_answers_in_fewer_steps(
    tokenizer: Tokenizer, concurrency: int
) -> None:
    answers = _answers(tokenizer)
    plain = replay(answers, tokenizer, COSTS, concurrency=concurrency, drafts=False)
    drafted = replay(answers, tokenizer, COSTS, concurrency=concurrency, drafts=True)
    # replay raises when an emitted token differs from the recorded answer
    tokens = sum(len(a.output_ids) for a in answers)
    decode_rows = sum(s.rows - s.prompt_rows for s in plain.steps)
    ended = sum(len(a.output_ids) < a.max_new for a in answers)
    # a row per emitted token after the first (the prompt's last row emits it), one per EOS
    assert decode_rows == tokens - len(answers) + ended
    assert len(drafted.steps) < len(plain.steps)
    summary = drafted.summary()
    assert summary["output_tok_s"] > plain.summary()["output_tok_s"]
    assert summary["concurrency"] == concurrency and summary["drafts"] is True


def test_replay_is_deterministic_and_warm_prompts_start_sooner(tokenizer: Tokenizer) -> None:
    answers = _answers(tokenizer)
    runs = [replay(answers, tokenizer, COSTS, concurrency=2, drafts=True) for _ in range(2)]
    assert [s.rows for s in runs[0].steps] == [s.rows for s in runs[1].steps]
    assert runs[0].makespan == runs[1].makespan
    warm = replay(answers, tokenizer, COSTS, concurrency=2, drafts=True, warm=True)
    assert sum(s.prompt_rows for s in warm.steps) < sum(s.prompt_rows for s in runs[0].steps)


def test_a_client_gap_waits_for_the_step_in_flight(tokenizer: Tokenizer) -> None:
    answers = _answers(tokenizer)
    at_once = replay(answers, tokenizer, COSTS, concurrency=1, drafts=False)
    gap = replay(answers, tokenizer, COSTS, concurrency=1, drafts=False, client_s=0.5)
    assert [r.submitted for r in gap.requests][1] == pytest.approx(at_once.requests[0].ended + 0.5)
    assert gap.makespan == pytest.approx(at_once.makespan + 2 * 0.5)


def test_a_table_of_one_point_is_refused() -> None:
    with pytest.raises(ValueError):
        StepCostTable({4: 0.04})


def test_live_costs_follow_the_measured_forwards() -> None:
    startup = [0.01 + 0.001 * r for r in range(65)]
    live = LiveCosts(startup, decay=0.1)
    live.observe(1, 1.2 * startup[1])  # one-row steps now cost 1.2x the start-up figure
    assert live.table[1] == pytest.approx(1.2 * startup[1])  # a first step counts in full
    assert live.table[64] == pytest.approx(1.2 * startup[64])  # flat beyond: all scaled
    for _ in range(30):
        live.observe(16, startup[16])  # 16-row steps cost what start-up measured
    assert live.table[16] == pytest.approx(startup[16])
    assert live.table[1] == pytest.approx(1.2 * startup[1])
    assert startup[8] < live.table[8] < 1.2 * startup[8]  # between the two points
    assert all(a <= b for a, b in zip(live.table, live.table[1:], strict=False))
    assert live.table[0] == live.table[1]
    for _ in range(20):
        live.observe(16, 3 * startup[16])  # later steps weigh 0.1 each
    assert live.table[16] == pytest.approx(startup[16] * 3 ** (1 - 0.9**20))
    before = list(live.table)
    live.observe(0, 1.0)  # outside the table: ignored
    live.observe(65, 1.0)
    live.observe(8, 0.0)
    assert live.table == before
    with pytest.raises(ValueError):
        LiveCosts([0.01])


def test_a_scheduler_started_on_wrong_costs_learns_the_steps_it_runs(
    tokenizer: Tokenizer,
) -> None:
    answers = _answers(tokenizer)
    steep = StepCostTable({1: 0.035, 4: 0.1, 16: 0.4, 64: 1.6})  # rows look 10x dearer
    wrong = replay(answers, tokenizer, COSTS, concurrency=1, drafts=True, startup=steep)
    ran = Counter(step.rows for step in wrong.steps)
    learned = [rows for rows, times in ran.items() if times >= 3]
    assert len(learned) >= 2  # plain steps and drafted ones
    for rows in learned:  # the row counts it ran again and again: their own costs
        assert wrong.final_costs[rows] == pytest.approx(COSTS(rows), rel=0.15)
    assert wrong.final_costs[8] < steep(8) / 2  # and the table between them follows
    # the same replay starting from the right costs never moves them
    right = replay(answers, tokenizer, COSTS, concurrency=1, drafts=True)
    assert right.final_costs == pytest.approx(COSTS.table(len(right.final_costs) - 1))
