"""The vLLM plugin's drafting (``integrations/vllm``), without vLLM: the gateway's drafts
followed as the answer grows, joined to vLLM's own proposals per request of a batch."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from draftgate_vllm.drafts import (
    DOCUMENTS_KEY,
    MIN_MATCH,
    PREDICTION_KEY,
    SEPARATOR,
    BatchDrafts,
    RequestDrafts,
    merged,
)
from draftgate_vllm.plugin import join_batch

PREDICTION = list(range(100, 120))


def test_the_prediction_is_aligned_with_the_answers_start() -> None:
    drafts = RequestDrafts(PREDICTION)
    proposal = drafts.propose([100], [1, 2, 100], 4)
    assert proposal.tokens == [101, 102, 103, 104] and proposal.aligned
    assert merged([7, 8], proposal) == [101, 102, 103, 104]
    proposal = drafts.propose([101, 102, 103], [100, 101, 102, 103], 8)
    assert proposal.tokens == list(range(104, 112)) and drafts.seen == 4


def test_after_an_edit_the_prediction_is_found_again_and_vllms_own_fills_the_gap() -> None:
    drafts = RequestDrafts(PREDICTION)
    drafts.propose([100, 101, 102], [100, 101, 102], 4)
    lost = drafts.propose([55], [101, 102, 55], 4)
    assert lost.tokens == [] and merged([7, 8], lost) == [7, 8]
    # the answer rejoins the prediction: found once MIN_MATCH tokens match
    short = drafts.propose([105, 106], [55, 105, 106], 4)
    assert short.tokens == [] and merged([7], short) == [7]
    found = drafts.propose([107], [55, 105, 106, 107], 4)
    assert found.tokens == [108, 109, 110, 111] and not found.aligned
    assert found.matched == MIN_MATCH and merged([7], found) == found.tokens


def test_documents_are_anchored_on_the_longest_match_and_drafts_stop_at_their_end() -> None:
    docs = [1, 2, 3, 4, 5, SEPARATOR, 9, 2, 3, 4, 6, 7, SEPARATOR]
    drafts = RequestDrafts(documents=docs)
    # 2 3 4 occurs twice; 9 2 3 4 only in the second document
    assert drafts.propose([9, 2, 3, 4], [8, 9, 2, 3, 4], 8).tokens == [6, 7]
    first = RequestDrafts(documents=docs).propose([2, 3, 4], [2, 3, 4], 8)
    assert first.tokens == [5] and first.matched == MIN_MATCH  # the first among equals


def test_an_aligned_prediction_wins_over_a_longer_document_match() -> None:
    drafts = RequestDrafts([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9, SEPARATOR])
    assert drafts.propose([1, 2, 3, 4], [1, 2, 3, 4], 2).tokens == [5, 6]


def test_extra_args_that_are_not_token_ids_carry_no_drafts() -> None:
    assert RequestDrafts.from_extra_args(None) is None
    assert RequestDrafts.from_extra_args({"other": [1, 2]}) is None
    assert RequestDrafts.from_extra_args({PREDICTION_KEY: [1, "2"]}) is None
    assert RequestDrafts.from_extra_args({PREDICTION_KEY: [1, -1]}) is None  # no separators
    assert RequestDrafts.from_extra_args({PREDICTION_KEY: [1, True]}) is None
    assert RequestDrafts.from_extra_args({DOCUMENTS_KEY: "1 2"}) is None
    drafts = RequestDrafts.from_extra_args({PREDICTION_KEY: [1, 2], DOCUMENTS_KEY: [3, -1]})
    assert drafts is not None and [t.tokens for t in drafts.tracks[:2]] == [[1, 2], [3, -1]]


def _runner(
    rows: list[tuple[str, list[int], int, Any]], max_model_len: int = 64, max_tokens: Any = None
) -> Any:
    """A stand-in for vLLM's model runner: its input batch (``rows``: request id, tokens,
    prompt length, extra_args; each request's ``max_tokens``) and requests."""
    token_ids = np.zeros((len(rows), max_model_len), dtype=np.int32)
    for i, (_, tokens, _, _) in enumerate(rows):
        token_ids[i, : len(tokens)] = tokens
    batch = SimpleNamespace(
        req_ids=[r[0] for r in rows],
        token_ids_cpu=token_ids,
        num_tokens_no_spec=np.array([len(r[1]) for r in rows], dtype=np.int32),
        num_prompt_tokens=np.array([r[2] for r in rows], dtype=np.int32),
    )
    requests = {
        r[0]: SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args=r[3], max_tokens=max_tokens)
        )
        for r in rows
    }
    return SimpleNamespace(input_batch=batch, requests=requests, max_model_len=max_model_len)


def test_join_batch_replaces_only_the_proposals_of_requests_with_drafts() -> None:
    xargs = {PREDICTION_KEY: [10, 11, 12, 13, 14]}
    runner = _runner(
        [
            ("a", [1, 2, 10], 2, xargs),  # drafts: the prediction after its first token
            ("b", [1, 2, 3], 2, None),  # no drafts: vLLM's own
            ("c", [1, 2], 2, xargs),  # a partial prefill: nothing proposed
        ]
    )
    batch_drafts = BatchDrafts()
    own = [[5], [6], []]
    joined = join_batch(runner, batch_drafts, own, [[10], [3], []], 3)
    assert joined == [[11, 12, 13], [6], []]
    assert set(batch_drafts.requests) == {"a", "b"}
    # the next step: "a" accepted two tokens; "b" left the batch and is forgotten
    runner = _runner([("a", [1, 2, 10, 11, 12, 13], 2, xargs)])
    assert join_batch(runner, batch_drafts, [[9]], [[13]], 3) == [[14]]
    assert set(batch_drafts.requests) == {"a"}


def test_join_batch_keeps_drafts_within_the_model_length() -> None:
    runner = _runner([("a", [1, 2, 10], 2, {PREDICTION_KEY: [10, 11, 12, 13]})], max_model_len=5)
    assert join_batch(runner, BatchDrafts(), [[]], [[10]], 8) == [[11]]


def test_join_batch_keeps_drafts_within_the_requests_max_tokens() -> None:
    xargs = {PREDICTION_KEY: [10, 11, 12, 13, 14, 15]}
    runner = _runner([("a", [1, 2, 10], 2, xargs)], max_tokens=4)  # 1 of 4 out
    assert join_batch(runner, BatchDrafts(), [[7]], [[10]], 8) == [[11, 12]]  # and 1 more
    last = _runner([("a", [1, 2, 10, 11, 12, 13], 2, xargs)], max_tokens=4)
    assert join_batch(last, BatchDrafts(), [[7, 8]], [[13]], 8) == [[]]  # vLLM's own too
    other = _runner([("b", [1, 2, 3, 4, 5, 6], 2, None)], max_tokens=4)
    assert join_batch(other, BatchDrafts(), [[7, 8]], [[6]], 8) == [[7, 8]]  # not ours


def test_a_place_found_on_a_short_match_proposes_in_proportion_to_it() -> None:
    drafts = RequestDrafts(documents=[*PREDICTION, SEPARATOR])
    found = drafts.propose([100, 101, 102], [100, 101, 102], 32)
    assert found.matched == MIN_MATCH and found.tokens == list(range(103, 109))  # 2 a match
    grown = drafts.propose(found.tokens[:4], [103, 104, 105, 106], 32)
    assert grown.tokens == list(range(107, 120))  # 7 matched: up to 14, the document's end


def test_vllms_own_proposal_is_kept_where_it_extends_the_gateways() -> None:
    drafts = RequestDrafts(documents=[*PREDICTION, SEPARATOR])
    found = drafts.propose([100, 101, 102], [100, 101, 102], 32)
    longer = [*found.tokens, 1, 2]
    assert merged(longer, found) == longer
    assert merged([103, 9, 9, 9, 9, 9, 9, 9], found) == found.tokens  # disagrees: ours


def _answer(drafts: RequestDrafts, prompt: list[int], answer: list[int], k: int) -> Any:
    """The proposal after the answer's tokens ``answer`` (the context: ``prompt`` then it)."""
    context = [*prompt, *answer]
    return drafts.propose(answer[drafts.seen :], context[-64:], k)


def test_a_change_the_answer_made_once_is_drafted_where_the_same_tokens_come_again() -> None:
    prediction = [1, 2, 3, 50, 4, 5, 6, 7, 8, 50, 9, 10, 11, 12, 13, 50, 14]
    drafts = RequestDrafts(prediction)
    answer = [1, 2, 3, 60, 61, 4, 5, 6]  # 50 renamed to 60 61, then the prediction again
    found = _answer(drafts, [900], answer, 6)
    assert found.tokens == [7, 8, 60, 61, 9, 10]  # the rename drafted at 50's next place
    answer += found.tokens
    assert _answer(drafts, [900], answer, 8).tokens == [11, 12, 13, 60, 61, 14]
    edit = drafts.tracks[0].edits.at(prediction, 3)
    assert edit is not None and (edit.deleted, edit.inserted, edit.hits) == ((50,), (60, 61), 1)


def test_an_insertion_is_learned_with_the_token_before_it() -> None:
    drafts = RequestDrafts([1, 2, 3, 4, 5, 6, 7, 8, 3, 9, 10])
    found = _answer(drafts, [900], [1, 2, 3, 70, 4, 5, 6], 8)
    assert found.tokens == [7, 8, 3, 70, 9, 10]


def test_a_change_the_answer_does_not_repeat_is_no_longer_drafted() -> None:
    prediction = [1, 2, 3, 50, 4, 5, 6, 7, 8, 50, 9, 10, 11, 12, 50, 13, 14, 15]
    drafts = RequestDrafts(prediction)
    answer = [1, 2, 3, 60, 4, 5, 6]
    assert _answer(drafts, [900], answer, 4).tokens == [7, 8, 60, 9]
    answer += [7, 8, 50, 9, 10, 11]  # the answer keeps 50 here: the edit missed
    assert _answer(drafts, [900], answer, 4).tokens == [12, 50, 13, 14]  # found again as is
    edits = drafts.tracks[0].edits
    assert edits.at(prediction, 3) is None and edits.count == 1  # missed more than hit: off


def test_a_track_is_found_again_nearest_after_where_the_answer_left_it() -> None:
    prediction = [10, 11, 12, 13, 5, 6, 7, 20, 14, 15, 16, 5, 6, 7, 21, 22]
    drafts = RequestDrafts(prediction)
    found = _answer(drafts, [900], [10, 11, 12, 13, 5, 6, 7, 20, 14, 15, 16, 99, 5, 6, 7], 4)
    assert found.tokens == [21, 22]  # not [20, 14, ...] after 5 6 7's first place
    # no track was left: the first place among equals
    first = RequestDrafts(documents=[*prediction, SEPARATOR])
    assert _answer(first, [900], [99, 5, 6, 7], 2).tokens == [20, 14]


def test_edits_apply_to_the_track_they_were_learned_on_only() -> None:
    answer = [1, 2, 3, 60, 4, 5, 6, 7, 30, 31, 32]  # the prediction's 50 became 60
    drafts = RequestDrafts([1, 2, 3, 50, 4, 5, 6, 7], [30, 31, 32, 50, 33, 34, SEPARATOR])
    _answer(drafts, [900], answer[:7], 2)
    assert drafts.tracks[0].edits.count == 1
    assert _answer(drafts, [900], answer, 4).tokens == [50, 33, 34]  # a document as it is


def test_the_answer_repeating_itself_is_drafted_past_its_end() -> None:
    loop = [40, 41, 42, 43, 44]
    drafts = RequestDrafts([1, 2, 3, 4, 5, 6])
    answer = [1, 2, 9, *loop, *loop[:3]]  # left the prediction; a loop begins again
    found = _answer(drafts, [900], answer, 16)
    assert found.matched == 3 and found.tokens == [43, 44, 40, 41, 42, 43]
    answer += found.tokens
    assert _answer(drafts, [900], answer, 16).tokens == [44, *loop, *loop, *loop]


def test_a_draft_that_reaches_the_predictions_end_is_not_extended_by_vllms_own() -> None:
    drafts = RequestDrafts([1, 2, 3, 4])
    proposal = _answer(drafts, [900], [1, 2], 8)
    assert proposal.tokens == [3, 4] and proposal.ends
    assert merged([3, 4, 7, 7], proposal) == [3, 4]
