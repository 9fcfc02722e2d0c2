"""Stop strings across piece boundaries."""

from __future__ import annotations

from local_verifier.stopping import StopChecker


def _feed(stop: list[str], pieces: list[str]) -> tuple[str, bool]:
    checker = StopChecker(stop)
    out = []
    for piece in pieces:
        emit, stopped = checker.push(piece)
        out.append(emit)
        if stopped:
            return "".join(out), True
    out.append(checker.flush())
    return "".join(out), False


def test_stop_split_across_pieces_is_not_emitted() -> None:
    assert _feed(["\n\n"], ["a", "b\n", "\nc"]) == ("ab", True)
    assert _feed(["END"], ["x E", "N", "Dy"]) == ("x ", True)


def test_partial_prefix_is_released_when_it_does_not_complete() -> None:
    checker = StopChecker(["END"])
    assert checker.push("abcEN") == ("abc", False)
    assert checker.push("x") == ("ENx", False)
    assert _feed(["END"], ["abE", "N"]) == ("abEN", False)


def test_earliest_stop_wins_and_no_stop_passes_through() -> None:
    assert _feed(["cd", "b"], ["abcd"]) == ("a", True)
    assert _feed([], ["a", "b"]) == ("ab", False)
    assert _feed([""], ["a"]) == ("a", False)
