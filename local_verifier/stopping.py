"""Stop strings matched across token boundaries."""

from __future__ import annotations

MAX_STOP_STRINGS = 4  # stop strings per request
MAX_STOP_CHARS = 1024  # characters per stop string


def _failure(stop: str) -> list[int]:
    """KMP's failure function: for each prefix of ``stop``, the length of its longest
    proper prefix that is also its suffix."""
    fail = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = fail[k - 1]
        if stop[i] == stop[k]:
            k += 1
        fail[i] = k
    return fail


class StopChecker:
    """Fed detokenized text piece by piece; holds back a tail that may begin a stop string.

    ``push(text) -> (emit, stopped)``: ``emit`` is text safe to send now; when ``stopped``
    it ends just before the first stop string, whose text is never emitted (``matched``
    names it: of those found in one push, the one that begins first). Each stop
    string is followed by a KMP automaton over the text, so a push costs time linear in its
    text's length (amortised) whatever the stop strings are. ``ValueError`` for more than
    ``MAX_STOP_STRINGS`` stop strings or one longer than ``MAX_STOP_CHARS``.
    """

    def __init__(self, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.stop = [s for s in stop if s]
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise ValueError(f"stop: a stop string has at most {MAX_STOP_CHARS} characters")
        self._fail = [_failure(s) for s in self.stop]
        self._matched = [0] * len(self.stop)  # per stop string: its prefix the text ends in
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stop:
            return text, False
        buf = self._held + text
        first: int | None = None  # where the earliest-starting stop string found begins
        for k, stop in enumerate(self.stop):
            end = self._advance(k, text)
            if end is not None:
                start = len(self._held) + end + 1 - len(stop)
                if first is None or start < first:
                    first, self.matched = start, stop
        if first is not None:
            self.stopped = True
            self._held = ""
            return buf[:first], True
        keep = max(self._matched)  # the text may still go on into a stop string from here
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def _advance(self, k: int, text: str) -> int | None:
        """Run stop string ``k``'s automaton over ``text``: the index where the string ends
        when it completes (its first occurrence), else None."""
        stop, fail, matched = self.stop[k], self._fail[k], self._matched[k]
        for i, char in enumerate(text):
            while matched and stop[matched] != char:
                matched = fail[matched - 1]
            if stop[matched] == char:
                matched += 1
                if matched == len(stop):
                    self._matched[k] = 0
                    return i
        self._matched[k] = matched
        return None

    def flush(self) -> str:
        """The held-back text, at the end of generation without a stop match."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
