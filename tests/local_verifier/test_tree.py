"""Tree attention mask and positions from parent indexes."""

from __future__ import annotations

import torch

from local_verifier.tree import tree_mask, tree_positions
from lookup.draft import depths


def test_depths() -> None:
    assert depths([-1, 0, 1, -1, 3, 0]).tolist() == [1, 2, 3, 1, 2, 2]


def test_positions_are_prefix_length_plus_depth() -> None:
    assert tree_positions([-1, 0, -1, 2], prefix_len=10).tolist() == [10, 11, 12, 11, 12]


def test_chain_mask_is_causal() -> None:
    mask = tree_mask([-1, 0, 1])
    assert torch.equal(mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_tree_mask_includes_self_and_ancestors_only() -> None:
    # root(0) -> a(1) -> c(3); root -> b(2) -> d(4); a -> e(5)
    mask = tree_mask([-1, -1, 0, 1, 0])
    expected = {
        0: {0},
        1: {0, 1},
        2: {0, 2},
        3: {0, 1, 3},
        4: {0, 2, 4},
        5: {0, 1, 5},
    }
    for row, allowed in expected.items():
        assert set(torch.nonzero(mask[row]).flatten().tolist()) == allowed
    assert mask.dtype == torch.bool


def test_empty_draft_is_the_root_alone() -> None:
    assert tree_mask([]).tolist() == [[True]]
    assert tree_positions([], prefix_len=3).tolist() == [3]
