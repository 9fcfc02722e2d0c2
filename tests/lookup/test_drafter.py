"""The drafter matches the longest suffix, realigns with the prediction and builds valid trees."""

from __future__ import annotations

import ctypes
import heapq
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookup import native, shared_library
from lookup.draft import Draft, Source
from lookup.drafter import Drafter, DrafterConfig
from lookup.index import build_index
from lookup.native import load_library


def _longest_suffix_match(seq: list[int], cap: int) -> int:
    """Longest m <= cap such that seq[-m:] occurs earlier with a next token (brute force)."""
    best = 0
    for m in range(1, min(cap, len(seq) - 1) + 1):
        tail = seq[-m:]
        if any(seq[i : i + m] == tail for i in range(len(seq) - m)):
            best = m
        else:
            break
    return best


def _check_tree(draft: Draft) -> None:
    parents = draft.parents.tolist()
    assert all(p < i for i, p in enumerate(parents))
    siblings: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        siblings.setdefault(p, []).append(int(draft.tokens[i]))
        if p >= 0:
            assert draft.scores[i] <= draft.scores[p] + 1e-7
    for tokens in siblings.values():
        assert len(tokens) == len(set(tokens))
    assert np.all((draft.scores > 0) & (draft.scores <= 1))


def test_chain_copies_the_longest_match_from_a_document() -> None:
    doc = [1, 2, 3, 4, 10, 11, 12, 50, 2, 3, 4, 20, 21, 22]
    drafter = Drafter([9, 9, 50, 2, 3, 4], documents=[build_index(np.array(doc))])
    draft = drafter.propose(3)
    assert draft.tokens.tolist() == [20, 21, 22]  # "50 2 3 4" beats the shorter "2 3 4"
    assert draft.is_chain
    assert set(draft.source.tolist()) == {Source.DOCUMENT}


def test_a_new_drafter_finds_the_longest_matches_of_the_prompts_end() -> None:
    """The first proposal copies from the longest match of the prompt's end, however long,
    not from the commoner short matches (an agent's tool call that repeats a file it read
    is found at its first token)."""
    doc = [8, 9, 40, 41, 42] * 3 + [5, 6, 7, 8, 9, 30, 31, 32]
    drafter = Drafter([3, 5, 6, 7, 8, 9], documents=[build_index(np.array(doc))])
    assert drafter._tracks[1].match == 5
    assert drafter.propose(3).tokens.tolist() == [30, 31, 32]
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 8, 7, 9, 1, 2, 3, 4, 5, 6, 7]
    drafter = Drafter(prompt)
    assert drafter._tracks[0].match == 7
    assert drafter.propose(3).tokens.tolist() == [9, 8, 7]


def test_prediction_comes_first_and_starts_aligned() -> None:
    prediction = [5, 6, 7, 8, 9]
    drafter = Drafter([1, 2, 3], prediction=prediction, documents=[build_index(np.array([3, 40]))])
    draft = drafter.propose(10)
    assert draft.tokens.tolist() == prediction
    assert set(draft.source.tolist()) == {Source.PREDICTION}


def test_realigns_after_an_edit() -> None:
    rng = np.random.default_rng(1)
    prediction = rng.integers(100, 5000, 200).tolist()
    edit = [1, 2, 3]
    answer = prediction[:80] + edit + prediction[90:]  # tokens 80..89 replaced
    drafter = Drafter([7, 7, 7], prediction=prediction)
    drafter.extend(answer[:80])
    assert drafter.propose(5).tokens.tolist() == prediction[80:85]
    drafter.extend(edit)  # diverged: no match of the edit in the prediction
    drafter.extend(answer[83:85])  # two tokens of the prediction again
    draft = drafter.propose(8)
    assert draft.tokens.tolist() == prediction[92:100]
    assert set(draft.source.tolist()) == {Source.PREDICTION}
    drafter.extend(answer[85:])
    assert drafter.prediction_usage() == (190, 10)


def test_prediction_usage_without_matches() -> None:
    drafter = Drafter([1], prediction=[10, 11, 12, 13])
    drafter.extend([20, 21, 22])
    assert drafter.prediction_usage() == (0, 4)
    assert Drafter([1]).prediction_usage() == (0, 0)


def test_prediction_may_match_after_a_preamble() -> None:
    prediction = list(range(100, 160))
    drafter = Drafter([1, 2], prediction=prediction)
    drafter.extend([7, 8, 9])  # e.g. "Here is the code:" before the prediction
    drafter.extend(prediction[:4])
    assert drafter.propose(6).tokens.tolist() == prediction[4:10]


def test_repeats_its_own_output_periodically() -> None:
    drafter = Drafter([1, 2, 3])
    drafter.extend([5, 6, 5, 6, 5, 6])
    assert drafter.propose(5).tokens.tolist() == [5, 6, 5, 6, 5]


def test_no_match_no_draft() -> None:
    drafter = Drafter([1, 2, 3, 4], documents=[build_index(np.array([10, 11, 12]))])
    drafter.extend([20])
    assert len(drafter.propose(8)) == 0
    assert len(drafter.propose(8, max_width=3)) == 0


def test_disagreeing_sources_make_a_tree() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 90, 91]
    docs = [build_index(np.array([9, 3, 4, 5, 6, 70, 71]))]
    drafter = Drafter(prompt + [3, 4, 5, 6], documents=docs)
    tree = drafter.propose(6, max_width=2)
    _check_tree(tree)
    roots = sorted(int(tree.tokens[i]) for i in np.flatnonzero(tree.parents == -1))
    assert roots == [70, 90]
    assert len(tree) <= 6
    chain = drafter.propose(6)
    assert chain.is_chain


@pytest.mark.parametrize("seed", range(8))
def test_match_length_is_the_longest_suffix_match(seed: int) -> None:
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 3, 30).tolist()
    drafter = Drafter(seq)
    for token in rng.integers(0, 3, 150).tolist():
        drafter.extend([token])
        seq.append(token)
        track = drafter._tracks[0]
        if track.complete:  # every occurrence is tracked: the match is the longest
            expected = _longest_suffix_match(seq, drafter.config.max_match)
            assert track.match == (expected if expected >= 2 else 0)
            assert all(seq[p - track.match : p] == seq[-track.match :] for p in track.positions)


@pytest.mark.parametrize("seed", range(8))
def test_random_trees_are_well_formed(seed: int) -> None:
    rng = np.random.default_rng(seed)
    docs = [build_index(rng.integers(0, 4, 300)) for _ in range(3)]
    drafter = Drafter(rng.integers(0, 4, 100).tolist(), documents=docs)
    for _ in range(40):
        width = int(rng.integers(1, 4))
        draft = drafter.propose(int(rng.integers(1, 20)), max_width=width)
        _check_tree(draft)
        children = np.bincount(draft.parents + 1, minlength=len(draft) + 1)
        assert children.max(initial=0) <= width
        drafter.extend(rng.integers(0, 4, int(rng.integers(1, 4))).tolist())


def test_acceptance_learns_from_committed_tokens() -> None:
    rng = np.random.default_rng(3)
    doc = rng.integers(0, 1000, 400).tolist()
    drafter = Drafter(doc[:10], documents=[build_index(np.array(doc))])
    first = drafter.propose(4).scores[0]
    for i in range(10, 60, 2):  # the answer keeps copying the document
        drafter.propose(4)
        drafter.extend(doc[i : i + 2])
    assert drafter.propose(4).scores[0] > first
    for _ in range(30):  # now every draft is wrong
        drafter.propose(4)
        drafter.extend(rng.integers(2000, 3000, 1).tolist() + doc[100:102])
    assert drafter.propose(4).scores[0] < first


def test_prediction_waits_for_the_answer_to_reach_it() -> None:
    prediction = [300, 301, 302, 303, 304, 305]
    drafter = Drafter([1, 2], prediction=prediction)
    drafter.extend([7, 8, 9])  # a preamble such as "```python\n"
    assert drafter.propose(3).tokens.tolist() == [300, 301, 302]  # still offered from the start
    drafter.extend([300])
    assert drafter.propose(3).tokens.tolist() == [301, 302, 303]
    drafter.extend([301, 302, 303, 304, 305])
    assert drafter.prediction_usage() == (6, 0)


def test_empty_prompt_and_sources() -> None:
    drafter = Drafter([], prediction=[], documents=[build_index(np.array([], np.uint32))])
    assert len(drafter.propose(4)) == 0
    drafter.extend([1, 2, 1, 2])
    assert drafter.propose(2).tokens.tolist() == [1, 2]


def test_a_match_at_the_end_of_the_prediction_does_not_crash_a_chain() -> None:
    drafter = Drafter([7], prediction=[1, 2, 3, 4, 9, 1, 2, 3])
    drafter.extend([1, 2, 8, 1, 2, 3])
    drafter.propose(8, 3)
    chain = drafter.propose(8, 1)
    assert chain.tokens.tolist() == [4, 9, 1, 2, 3]  # the earlier occurrence still drafts


def test_the_next_source_drafts_when_the_best_is_used_up() -> None:
    doc = build_index(np.array([5, 6, 7, 8, 40, 41], dtype=np.int64))
    drafter = Drafter([5, 6, 7, 8, 30], prediction=[5, 6, 7, 8], documents=[doc])
    drafter.extend([5, 6, 7, 8])  # the prediction is used up: nothing follows its match
    draft = drafter.propose(4, 1)
    assert len(draft) > 0
    assert draft.tokens[0] in (30, 40)  # the prompt's or the document's continuation


@settings(max_examples=300, deadline=None)
@given(
    source=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    output=st.lists(st.integers(0, 4), max_size=16),
    widths=st.lists(st.integers(1, 4), min_size=1, max_size=4),
)
def test_fuzz_drafter_at_every_source_ending(
    source: list[int], output: list[int], widths: list[int]
) -> None:
    """Small alphabets make matches run to the end of the prediction, the prompt, the
    document and the output; every proposal is a valid tree over known tokens."""
    doc = build_index(np.array(source, dtype=np.int64))
    drafter = Drafter(source[: len(source) // 2 + 1], prediction=source, documents=[doc])
    for step, token in enumerate([*output, *source]):
        drafter.extend([token])
        for width in widths:
            draft = drafter.propose(1 + step % 8, width)
            assert len(draft) <= 1 + step % 8
            _check_tree(draft)
            assert all(0 <= t <= 4 for t in draft.tokens.tolist())


def _reference_tree(
    conts: list[list[int]], negs: list[float], rates: list[list[float]], size: int, width: int
) -> tuple[list[int], list[int], list[float]]:
    """The trie of the continuations (a node's weight sums minus ``negs`` of those through
    it, its rate is its creator's at its depth), scored by path probability and expanded
    best first with a heap: (tokens, parents, scores) of the draft, parents first."""
    tok: list[int] = []
    par: list[int] = []
    weight: list[float] = []
    rate: list[float] = []
    depth: list[int] = []
    kids: dict[int, list[int]] = {-1: []}
    for c, tokens in enumerate(conts):
        node = -1
        for d, token in enumerate(tokens):
            child = next((k for k in kids[node] if tok[k] == token), None)
            if child is None:
                child = len(tok)
                tok.append(token), par.append(node), depth.append(d)
                weight.append(0.0 - negs[c])
                rate.append(rates[c][d])
                kids[node].append(child)
                kids[child] = []
            else:
                weight[child] -= negs[c]
            node = child
    score: list[float] = []
    for i, p in enumerate(par):
        share = weight[i] / sum(weight[k] for k in kids[p])
        score.append((1.0 if p < 0 else score[p]) * rate[i] * share)
    order: list[int] = []
    heap = sorted((-score[k], k) for k in kids[-1])[:width]
    while heap and len(order) < size:
        _, node = heapq.heappop(heap)
        order.append(node)
        for item in sorted((-score[k], k) for k in kids[node])[:width]:
            heapq.heappush(heap, item)
    order.sort(key=lambda i: (depth[i], -score[i], i))
    where = {old: new for new, old in enumerate(order)} | {-1: -1}
    return [tok[i] for i in order], [where[par[i]] for i in order], [score[i] for i in order]


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("seed", range(12))
def test_trees_equal_a_best_first_expansion_of_the_merged_trie(seed: int, native: bool) -> None:
    """Small alphabets make continuations share prefixes, branch at shared nodes and
    crowd more children under one node than the width allows."""
    if native:
        _require_compiled_trees()
    rng = np.random.default_rng(seed)
    alphabet = 3 + seed % 4
    docs = [build_index(rng.integers(0, alphabet, 60)) for _ in range(5)]
    config = DrafterConfig(native_trees=native)
    drafter = Drafter(rng.integers(0, alphabet, 40).tolist(), documents=docs, config=config)
    trees = 0
    for _ in range(60):
        size, width = int(rng.integers(1, 24)), int(rng.integers(2, 4))
        candidates = drafter._candidates(drafter._ranked(), drafter.config.tree_candidates)
        draft = drafter.propose(size, max_width=width)
        if len(candidates) > 1:
            trees += 1
            conts, negs, rates = [], [], []
            for rank, (neg, source, pos, track) in enumerate(candidates[:4]):
                tokens = drafter._continuation(track, pos, size if rank == 0 else (size + 1) // 2)
                conts.append(tokens)
                negs.append(neg)
                rates.append(drafter.acceptance.rates(source, track.match, len(tokens)))
            tokens, parents, scores = _reference_tree(conts, negs, rates, size, width)
            assert draft.tokens.tolist() == tokens
            assert draft.parents.tolist() == parents
            assert np.array_equal(draft.scores, np.asarray(scores, np.float32))
        drafter.extend(rng.integers(0, alphabet, int(rng.integers(1, 4))).tolist())
    assert trees > 10


def _require_compiled_trees() -> None:
    library, why = load_library()
    if library is None and why.startswith("no C++ compiler"):
        pytest.skip(why)  # nothing to compare on a machine without g++
    assert library is not None, why


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    alphabet=st.integers(2, 8),
    widths=st.lists(st.integers(2, 4), min_size=1, max_size=3),
)
def test_compiled_trees_equal_python_trees(seed: int, alphabet: int, widths: list[int]) -> None:
    """Bit for bit, through learning: the same drafts from the same commits, with a
    prediction, documents of every retrieved kind and output copied from the context."""
    _require_compiled_trees()
    rng = np.random.default_rng(seed)
    docs = [build_index(rng.integers(0, alphabet, int(rng.integers(0, 80)))) for _ in range(6)]
    kinds = [Source.DOCUMENT, Source.RETRIEVED, Source.ANSWER] * 2
    prompt = rng.integers(0, alphabet, int(rng.integers(0, 50))).tolist()
    prediction = rng.integers(0, alphabet, int(rng.integers(0, 40))).tolist()
    drafters = [
        Drafter(prompt, prediction, docs, DrafterConfig(native_trees=n), kinds) for n in (1, 0)
    ]
    for step in range(25):
        size = int(rng.integers(1, 40))
        native, python = (d.propose(size, widths[step % len(widths)]) for d in drafters)
        for field in ("tokens", "parents", "scores", "source"):
            a, b = getattr(native, field), getattr(python, field)
            assert a.dtype == b.dtype and np.array_equal(a, b)
        taken = native.tokens[: int(rng.integers(0, len(native) + 1))].tolist()
        commit = taken + rng.integers(0, alphabet, int(rng.integers(1, 4))).tolist()
        for d in drafters:
            d.extend(commit)


def test_without_a_compiler_trees_are_built_in_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setenv(shared_library.CACHE_ENV, str(tmp_path))
    library, why = native._load()
    assert library is None and why.startswith("build failed")
    monkeypatch.setenv(native.DISABLE_ENV, "1")
    assert native._load() == (None, f"disabled by {native.DISABLE_ENV}")


def test_compiled_trees_larger_than_the_builder_buffer() -> None:
    _require_compiled_trees()
    rng = np.random.default_rng(5)
    docs = [build_index(rng.integers(0, 3, 3000)) for _ in range(4)]
    drafters = [
        Drafter([0, 1, 2, 0], documents=docs, config=DrafterConfig(native_trees=n)) for n in (1, 0)
    ]
    for size in (300, 5, 700):
        native, python = (d.propose(size, 3) for d in drafters)
        assert len(native) > 64 or size < 64  # more than the builder's first buffer holds
        for field in ("tokens", "parents", "scores", "source"):
            assert np.array_equal(getattr(native, field), getattr(python, field))
        for d in drafters:
            d.extend([1])


def test_the_compiled_builder_keeps_the_gil() -> None:
    """A build takes microseconds: handing the GIL to another busy thread around it would
    make the proposal wait for the interpreter's switch interval (ms) to get it back."""
    _require_compiled_trees()
    library, _ = load_library()
    assert isinstance(library, ctypes.PyDLL)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    alphabet=st.integers(2, 6),
    tree_candidates=st.integers(2, 12),
    cap=st.integers(1, 10),
)
def test_the_compiled_proposal_ranks_and_collects_like_python(
    seed: int, alphabet: int, tree_candidates: int, cap: int
) -> None:
    """The one compiled call ranks the tracks and collects the candidates as ``_ranked``
    and ``_candidates`` do: equal rates tie-broken by source and track, a context track's
    occurrences split between the prompt and the output, more candidates than one
    track holds, one candidate (a chain copied in Python) and none (empty)."""
    _require_compiled_trees()
    rng = np.random.default_rng(seed)
    docs = [build_index(rng.integers(0, alphabet, int(rng.integers(1, 30)))) for _ in range(4)]
    kinds = [Source.RETRIEVED, Source.DOCUMENT, Source.ANSWER, Source.RETRIEVED]
    prompt = rng.integers(0, alphabet, int(rng.integers(0, 30))).tolist()
    drafters = [
        Drafter(
            prompt,
            documents=docs,
            config=DrafterConfig(candidates=cap, tree_candidates=tree_candidates, native_trees=n),
            document_sources=kinds,
        )
        for n in (1, 0)
    ]
    assert drafters[0]._native is not None and drafters[1]._native is None
    kinds_seen = set()
    for _ in range(30):
        size, width = int(rng.integers(1, 20)), int(rng.integers(2, 5))
        native, python = (d.propose(size, width) for d in drafters)
        kinds_seen.add(0 if not len(python) else 1 if python.is_chain else 2)
        for field in ("tokens", "parents", "scores", "source"):
            a, b = getattr(native, field), getattr(python, field)
            assert a.dtype == b.dtype and np.array_equal(a, b)
        commit = rng.integers(0, alphabet, int(rng.integers(1, 4))).tolist()
        for d in drafters:
            d.extend(commit)
        assert drafters[0].acceptance.table == drafters[1].acceptance.table
    assert 2 in kinds_seen or alphabet > 4  # small alphabets always make trees


def test_compiled_tree_arrays_are_the_drafts_own() -> None:
    """Each proposal returns new arrays that own their data: drafts kept by the caller are
    not overwritten by later proposals, and no reference to them is leaked."""
    _require_compiled_trees()
    rng = np.random.default_rng(3)
    docs = [build_index(rng.integers(0, 3, 50)) for _ in range(4)]
    drafter = Drafter(rng.integers(0, 3, 20).tolist(), documents=docs)
    kept: list[tuple[Draft, list[int], list[float]]] = []
    for _ in range(40):
        draft = drafter.propose(12, 3)
        if not draft.is_chain:
            assert draft.tokens.flags.owndata and draft.scores.flags.owndata
            # the draft and the drafter's last proposal hold them, nothing else
            refs = sys.getrefcount(draft.tokens), sys.getrefcount(draft.scores)
            assert refs == (3, 2)
            kept.append((draft, draft.tokens.tolist(), draft.scores.tolist()))
        drafter.extend(rng.integers(0, 3, 2).tolist())
    assert len(kept) > 10
    for draft, tokens, scores in kept:
        assert draft.tokens.tolist() == tokens and draft.scores.tolist() == scores


def test_the_compiled_proposal_rejects_a_changed_track_list() -> None:
    """The drafter's block is written for its tracks: a call with another list raises
    instead of reading past the block."""
    _require_compiled_trees()
    drafter = Drafter([1, 2, 3, 1, 2], documents=[build_index(np.array([1, 2, 4]))])
    assert drafter._native is not None
    with pytest.raises(ValueError, match="tracks changed"):
        drafter._native((drafter._block_address, drafter._tracks[:1], 0, 0, 8, 3))
