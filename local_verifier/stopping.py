"""Stop strings matched across token boundaries."""

from __future__ import annotations


class StopChecker:
    """Fed detokenized text piece by piece; holds back a tail that may begin a stop string.

    ``push(text) -> (emit, stopped)``: ``emit`` is text safe to send now; when ``stopped``
    it ends just before the first stop string, whose text is never emitted.
    """

    def __init__(self, stop: list[str] | tuple[str, ...] = ()) -> None:
        self.stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self.stop:
            return text, False
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[: min(hits)], True
        keep = self._longest_stop_prefix_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The held-back text, at the end of generation without a stop match."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, buf: str) -> int:
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
