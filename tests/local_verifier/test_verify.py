"""Greedy and sampled acceptance rules on synthetic target outputs."""

from __future__ import annotations

import torch

from local_verifier.verify import Verdict, children_of, verify_greedy, verify_sampled

V = 10


def _rows(argmaxes: list[int]) -> torch.Tensor:
    """Logits ``[len, V]`` whose row i has its maximum at ``argmaxes[i]``."""
    logits = torch.zeros(len(argmaxes), V)
    for row, token in enumerate(argmaxes):
        logits[row, token] = 5.0
    return logits


def _one_hot_sampler(row: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(row, 1, generator=generator))


def test_children_in_draft_order() -> None:
    assert children_of([-1, -1, 0, 1, 0]) == {-1: [0, 1], 0: [2, 4], 1: [3]}


def test_greedy_chain_all_accepted_gives_bonus() -> None:
    # rows: after root, after node0, after node1, after node2
    verdict = verify_greedy(_rows([3, 4, 5, 6]), [3, 4, 5], [-1, 0, 1])
    assert verdict == Verdict([0, 1, 2], 6)


def test_greedy_chain_stops_at_first_mismatch_with_correction() -> None:
    verdict = verify_greedy(_rows([3, 4, 5, 6]), [3, 9, 5], [-1, 0, 1])
    assert verdict == Verdict([0], 4)


def test_greedy_empty_draft_is_a_plain_step() -> None:
    assert verify_greedy(_rows([7]), [], []) == Verdict([], 7)


def test_greedy_first_token_wrong() -> None:
    assert verify_greedy(_rows([2, 4, 5]), [1, 4], [-1, 0]) == Verdict([], 2)


def test_greedy_tree_follows_the_matching_branch() -> None:
    # root children: node0 (token 1), node1 (token 2); node2 child of node0, node3 child of node1
    tokens = [1, 2, 7, 8]
    parents = [-1, -1, 0, 1]
    # after root -> 2 (node1); after node1 (row 2) -> 8 (node3); after node3 (row 4) -> 9
    logits = _rows([2, 0, 8, 0, 9])
    assert verify_greedy(logits, tokens, parents) == Verdict([1, 3], 9)


def test_greedy_tree_rejects_all_branches() -> None:
    logits = _rows([5, 0, 0])
    assert verify_greedy(logits, [1, 2], [-1, -1]) == Verdict([], 5)


def test_sampled_accepts_certain_token_and_samples_bonus() -> None:
    probs = torch.zeros(3, V)
    probs[0, 3] = 1.0
    probs[1, 4] = 1.0
    probs[2, 6] = 1.0
    gen = torch.Generator().manual_seed(0)
    verdict = verify_sampled(probs, [3, 4], [-1, 0], gen, _one_hot_sampler)
    assert verdict == Verdict([0, 1], 6)


def test_sampled_never_accepts_zero_probability_token() -> None:
    probs = torch.full((2, V), 1.0 / (V - 1))
    probs[0, 0] = 0.0
    gen = torch.Generator().manual_seed(1)
    for _ in range(200):
        verdict = verify_sampled(probs, [0], [-1], gen, _one_hot_sampler)
        assert verdict.accepted == []
        assert verdict.next_token != 0


def test_sampled_rejected_candidates_are_excluded_from_the_residual() -> None:
    # Two candidates at depth 1 hold all the mass except token 9: after both are
    # rejected only token 9 may come out.
    probs = torch.zeros(3, V)
    probs[0, 1] = 0.45
    probs[0, 2] = 0.45
    probs[0, 9] = 0.10
    probs[1:, 0] = 1.0
    gen = torch.Generator().manual_seed(2)
    seen = set()
    for _ in range(300):
        verdict = verify_sampled(probs, [1, 2], [-1, -1], gen, _one_hot_sampler)
        if verdict.accepted:
            seen.add(verdict.accepted[0])
            assert verdict.next_token == 0
        else:
            assert verdict.next_token == 9
    assert seen == {0, 1}
