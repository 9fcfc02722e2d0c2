"""The checks every engine answer passes before anything in it is committed: ids inside
the vocabulary, finite logprobs at most 0, ranks from 1, the argmax and its runner-up in
order; vLLM's rows read only past the positions its cache served."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.endpoints.remote import rows
from gateway.endpoints.remote.failures import UnusableAnswer
from gateway.endpoints.remote.wire import _vllm_scored

VOCAB = 100


def _row(*entries: tuple[Any, Any, Any]) -> dict[str, Any]:
    return {str(t): {"logprob": lp, "rank": r, "decoded_token": None} for t, lp, r in entries}


def test_a_computed_row_gives_its_argmax_and_lead() -> None:
    assert rows.vllm_prompt_row(_row((7, -0.25, 1), (9, -1.5, 2), (3, -4.0, 17)), VOCAB) == (
        7,
        1.25,
    )
    assert rows.sglang_row([[-0.5, 4, None], [-0.75, 5, None]], VOCAB) == (4, 0.25)


@pytest.mark.parametrize(
    "row",
    [
        _row((234818303, -0.1, 1), (9, -1.0, 2)),  # outside the vocabulary
        _row((-64513, -0.1, 1), (9, -1.0, 2)),  # negative
        _row((VOCAB, -0.1, 1), (9, -1.0, 2)),  # one past the last id
        _row((7, 163.7, 1), (9, -1.0, 2)),  # a logprob above 0
        _row((7, math.nan, 1), (9, -1.0, 2)),
        _row((7, -math.inf, 1), (9, -1.0, 2)),
        _row((7, -0.1, -2067090176), (9, -1.0, 2)),  # a rank below 1
        _row((7, -0.1, 0), (9, -1.0, 2)),
        _row((7, -0.1, 1)),  # no runner-up
        _row((7, -0.1, 1), (9, -1.0, 1)),  # two argmaxes
        _row((7, -2.0, 1), (9, -1.0, 2)),  # out of rank order
        _row((7, -0.1, 1), (9, -1.0, 2), (3, -0.5, 5)),  # a lower rank above the runner-up
        {"7": [1, 2]},
        [],
    ],
)
def test_a_row_the_engine_cannot_have_computed_is_refused(row: Any) -> None:
    with pytest.raises(UnusableAnswer):
        rows.vllm_prompt_row(row, VOCAB)


@pytest.mark.parametrize("ids", [[1, VOCAB], [1, -3], [True], ["5"], "12", [1.0]])
def test_streamed_ids_outside_the_vocabulary_are_refused(ids: Any) -> None:
    with pytest.raises(UnusableAnswer):
        rows.token_ids(ids, VOCAB)


def _answer(prompt_rows: list[Any], cached: int | None) -> dict[str, Any]:
    step = {
        "token_id": 11,
        "logprob": -0.1,
        "rank": 1,
        "top_logprobs": [
            {"token_id": 11, "logprob": -0.1, "rank": 1},
            {"token_id": 12, "logprob": -2.0, "rank": 2},
        ],
    }
    details = None if cached is None else {"cached_tokens": cached}
    return {
        "prompt_logprobs": prompt_rows,
        "usage": {"prompt_tokens_details": details},
        "choices": [{"token_ids": [11], "logprobs": {"content": [step]}}],
    }


GARBAGE = _row((234818303, 163.7, -5), (3, -0.5, 0))
GOOD = _row((5, -0.1, 1), (6, -3.0, 2))


def test_vllm_rows_are_read_only_past_the_cached_positions() -> None:
    # six tokens, the last two a draft; the cache served four, so rows 1..4 are garbage
    prompt_rows = [None, GARBAGE, GARBAGE, GARBAGE, GARBAGE, GOOD]
    scored = _vllm_scored(_answer(prompt_rows, 4), 6, 1, VOCAB, read_cache=True)
    assert isinstance(scored, tuple)
    assert scored[0] == [5, 11] and scored[1] == pytest.approx([2.9, 1.9])
    # a draft reaching into the served positions: asked again (None), never read
    assert _vllm_scored(_answer(prompt_rows, 4), 6, 2, VOCAB, read_cache=True) is None
    # no cached_tokens: nothing says which rows were computed
    reason = _vllm_scored(_answer(prompt_rows, None), 6, 1, VOCAB, read_cache=True)
    assert isinstance(reason, str) and "cached_tokens" in reason
    # without the cache every row is computed, and every row read is checked
    with pytest.raises(UnusableAnswer):
        _vllm_scored(_answer(prompt_rows, 0), 6, 2, VOCAB, read_cache=False)
    with pytest.raises(UnusableAnswer):  # not one row per token
        _vllm_scored(_answer(prompt_rows[:-1], 0), 6, 1, VOCAB, read_cache=False)
