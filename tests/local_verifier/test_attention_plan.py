"""AttentionPlan: which keys each row attends to, and their per-step copy for the torch kernels."""

import torch

from local_verifier.kernels.plan import AttentionPlan


def _plan() -> AttentionPlan:
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return AttentionPlan.build(
        [torch.arange(10, 14), torch.arange(40, 42)],
        [torch.arange(14, 17), torch.arange(42, 45)],
        [None, tree],
    )


def test_row_keys_follow_causal_and_tree_masks() -> None:
    plan = _plan()
    assert plan.row_keys(0).tolist() == [10, 11, 12, 13, 14]
    assert plan.row_keys(2).tolist() == [10, 11, 12, 13, 14, 15, 16]
    assert plan.row_keys(3).tolist() == [40, 41, 42]
    assert plan.row_keys(5).tolist() == [40, 41, 42, 44]  # the second child skips its sibling


def test_row_key_lists_join_every_row_once_per_plan() -> None:
    plan = _plan()
    joined, lengths = plan.row_key_lists(torch.device("cpu"))
    rows = joined.split(lengths)
    assert len(rows) == 6
    for r, keys in enumerate(rows):
        assert torch.equal(keys, plan.row_keys(r)), r
    assert plan.row_key_lists(torch.device("cpu"))[0] is joined  # built once, for all layers
