"""What an engine sends one submitted request, gathered on the engine thread: the tests'
``on_item`` callback."""

from __future__ import annotations

from typing import Any

from local_verifier.events import END, Failed, GenerationStats, TextDelta
from local_verifier.logprobs import TokenLogprob


class Collector:
    """Items of one submitted request, in the order the engine sent them."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def __call__(self, item: Any) -> None:
        self.items.append(item)

    @property
    def ids(self) -> list[int]:
        """The token ids sent so far."""
        return [t for d in self._deltas() for t in d.token_ids]

    @property
    def stats(self) -> GenerationStats:
        """The closing stats of an answer that ended without an error."""
        stats = self._last()
        assert isinstance(stats, GenerationStats)
        return stats

    @property
    def text(self) -> str:
        """The whole text of an answer that ended without an error."""
        assert self.stats is not None
        return "".join(d.text for d in self._deltas())

    @property
    def logprobs(self) -> list[TokenLogprob]:
        return [lp for d in self._deltas() for lp in d.logprobs or []]

    @property
    def error(self) -> Exception:
        """The error an answer ended with."""
        failed = self._last()
        assert isinstance(failed, Failed)
        return failed.error

    def _last(self) -> Any:
        """The item before the end: the answer's stats or its error."""
        assert self.items[-1] is END
        return self.items[-2]

    def _deltas(self) -> list[TextDelta]:
        return [i for i in self.items if isinstance(i, TextDelta)]
