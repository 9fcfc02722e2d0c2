"""Stop strings across piece boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local_verifier.stopping import MAX_STOP_CHARS, MAX_STOP_STRINGS, StopChecker


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


def _reference(stop: list[str], pieces: list[str]) -> tuple[str, bool]:
    """The definition: after each piece, the earliest-starting stop string in what is not
    yet sent ends the text; else everything but the longest tail that begins one is sent."""
    held, out = "", []
    stops = [s for s in stop if s]
    for piece in pieces:
        buf = held + piece
        hits = [i for i in (buf.find(s) for s in stops) if i >= 0]
        if hits:
            return "".join(out) + buf[: min(hits)], True
        keep = max((n for s in stops for n in range(1, len(s)) if buf.endswith(s[:n])), default=0)
        held = buf[len(buf) - keep :]
        out.append(buf[: len(buf) - keep])
    return "".join(out) + held, False


@settings(max_examples=500, deadline=None)
@given(
    stop=st.lists(st.text(alphabet="ab\n", min_size=0, max_size=6), max_size=MAX_STOP_STRINGS),
    pieces=st.lists(st.text(alphabet="ab\nc", max_size=5), max_size=12),
)
def test_stops_match_their_definition(stop: list[str], pieces: list[str]) -> None:
    assert _feed(stop, pieces) == _reference(stop, pieces)


def _matched(stop: list[str], pieces: list[str]) -> str | None:
    checker = StopChecker(stop)
    for piece in pieces:
        if checker.push(piece)[1]:
            break
    return checker.matched


def _reference_matched(stop: list[str], pieces: list[str]) -> str | None:
    """The stop string that ends the text: the earliest-starting one in what is not yet
    sent (the first listed of those starting there)."""
    held = ""
    stops = [s for s in stop if s]
    for piece in pieces:
        buf = held + piece
        hits = [(buf.find(s), k) for k, s in enumerate(stops) if s in buf]
        if hits:
            return stops[min(hits)[1]]
        keep = max((n for s in stops for n in range(1, len(s)) if buf.endswith(s[:n])), default=0)
        held = buf[len(buf) - keep :]
    return None


def test_the_stop_string_that_ended_the_text_is_named() -> None:
    assert _matched(["cd", "b"], ["ab", "cd"]) == "b"
    assert _matched(["END", "\n\n"], ["x E", "N", "Dy"]) == "END"
    assert _matched(["END"], ["abEN", "x"]) is None


@settings(max_examples=500, deadline=None)
@given(
    stop=st.lists(st.text(alphabet="ab\n", min_size=0, max_size=6), max_size=MAX_STOP_STRINGS),
    pieces=st.lists(st.text(alphabet="ab\nc", max_size=5), max_size=12),
)
def test_the_named_stop_string_matches_its_definition(stop: list[str], pieces: list[str]) -> None:
    assert _matched(stop, pieces) == _reference_matched(stop, pieces)


class _Counted(str):
    """A stop string that counts how often its characters are read."""

    reads = 0

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        _Counted.reads += 1
        return str.__getitem__(self, key)


@pytest.mark.parametrize("text", ["a", "ab", "aab"])
def test_work_is_linear_in_the_text_and_the_stop_string(text: str) -> None:
    """A long stop string that the text keeps almost matching: each character is read a
    bounded number of times (copying every prefix at each mismatch is quadratic)."""
    stop = _Counted("a" * (MAX_STOP_CHARS - 1) + "b")
    _Counted.reads = 0
    checker = StopChecker([stop])
    pieces = [text] * 20_000
    sent = "".join(checker.push(p)[0] for p in pieces) + checker.flush()
    assert sent == text * len(pieces) and not checker.stopped  # never 1023 a's in a row
    assert _Counted.reads <= 4 * (len(text) * len(pieces) + len(stop))


def test_stop_strings_are_bounded() -> None:
    with pytest.raises(ValueError, match="stop"):
        StopChecker(["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match="stop"):
        StopChecker(["x" * (MAX_STOP_CHARS + 1)])
    StopChecker(["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS)
