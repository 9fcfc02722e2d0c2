"""Draft: the shape shared by the drafter, the controller and the verifier."""

from __future__ import annotations

import numpy as np
import pytest

from lookup.draft import Draft


def test_empty_draft() -> None:
    draft = Draft.empty()
    assert len(draft) == 0
    assert draft.is_chain
    assert draft.depths().tolist() == []
    assert draft.tokens.dtype == np.int64 and draft.parents.dtype == np.int32
    assert draft.scores.dtype == np.float32 and draft.source.dtype == np.int8


def test_chain_and_tree_depths() -> None:
    chain = Draft.chain([5, 6, 7], [0.9, 0.8, 0.7], [0, 0, 0])
    assert chain.is_chain
    assert chain.parents.tolist() == [-1, 0, 1]
    assert chain.depths().tolist() == [1, 2, 3]
    tree = Draft(
        np.array([1, 2, 3, 4], np.int64),
        np.array([-1, -1, 0, 2], np.int32),
        np.array([0.6, 0.3, 0.5, 0.4], np.float32),
        np.array([0, 1, 0, 0], np.int8),
    )
    assert not tree.is_chain
    assert tree.depths().tolist() == [1, 1, 2, 3]


def test_subset_reindexes_parents() -> None:
    tree = Draft(
        np.array([1, 2, 3, 4], np.int64),
        np.array([-1, -1, 0, 2], np.int32),
        np.array([0.6, 0.3, 0.5, 0.4], np.float32),
        np.array([0, 1, 0, 0], np.int8),
    )
    sub = tree.subset([0, 2, 3])
    assert sub.tokens.tolist() == [1, 3, 4]
    assert sub.parents.tolist() == [-1, 0, 1]
    assert sub.is_chain
    assert sub.source.tolist() == [0, 0, 0]


def test_check_rejects_children_before_parents_and_ids_outside_the_vocabulary() -> None:
    good = Draft.chain([1, 2, 3], [0.5, 0.4, 0.3], [0, 0, 0])
    good.check(vocab_size=4)
    with pytest.raises(ValueError, match="vocabulary"):
        good.check(vocab_size=3)
    bad = Draft(good.tokens, np.array([-1, 2, 0], np.int32), good.scores, good.source)
    with pytest.raises(ValueError, match="precede"):
        bad.check(vocab_size=4)
