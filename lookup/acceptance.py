"""Per-request estimates of how often a copied token is accepted.

The estimate for a draft token depends on its source and on the length of the suffix
match it continues (a longer match is more reliable). Each (source, match bucket) cell
starts from a prior and follows the request's own outcomes with exponential decay, so a
request whose matches keep failing (open-ended text) drives its estimates down within a
few steps, and one that keeps copying (a code edit) drives them up.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from itertools import accumulate
from operator import mul

import numpy as np

from lookup.draft import Source

BUCKET_EDGES: tuple[int, ...] = (1, 4, 8, 16, 32)
"""Match-length bucket b holds lengths in [EDGES[b-1], EDGES[b]); bucket 0 is length 0."""

# prior probability that the next copied token is accepted, per source and match bucket
_PRIORS: dict[Source, tuple[float, ...]] = {
    Source.PREDICTION: (0.6, 0.45, 0.7, 0.85, 0.9, 0.93),
    Source.PROMPT: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),
    Source.OUTPUT: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),
    Source.DOCUMENT: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),  # selected for the request
    Source.RETRIEVED: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),
    Source.ANSWER: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),
    Source.CONVERSATION: (0.2, 0.25, 0.45, 0.65, 0.8, 0.88),
}


def bucket(match_len: int) -> int:
    """The match-length bucket of ``match_len``."""
    return BUCKET_OF[match_len] if match_len < len(BUCKET_OF) else len(BUCKET_EDGES)


BUCKET_OF = [sum(m >= edge for edge in BUCKET_EDGES) for m in range(1024)]
"""The bucket of each match length below 1024 (longer ones are in the last bucket)."""


class AcceptanceModel:
    """Decayed accept/trial counts per (source, match bucket), blended with a prior."""

    def __init__(self, prior_weight: float = 3.0, decay: float = 0.85) -> None:
        self.prior_weight = prior_weight
        self.decay = decay
        n = len(BUCKET_EDGES) + 1
        # indexed by int(Source), then bucket
        self._hits = [[0.0] * n for _ in Source]
        self._trials = [[0.0] * n for _ in Source]
        self._priors = [_PRIORS[s] for s in Source]
        self.table = [list(p) for p in self._priors]
        """The current rates, per source then match bucket (read them, do not write)."""
        self._rows = np.array(self.table)  # the same rates as float64 rows

    @property
    def rows(self) -> np.ndarray:
        """The rates as float64 [source, bucket], C-contiguous, updated in place by
        :meth:`observe` (read them, do not write)."""
        return self._rows

    def rate(self, source: int, match_len: int) -> float:
        """Estimated probability that the next token copied from a match is accepted."""
        return self.table[source][bucket(match_len)]

    def rates(self, source: int, first_match: int, n: int) -> list[float]:
        """``rate`` for match lengths first_match, first_match + 1, ... (n of them)."""
        table = self.table[source]
        stop = first_match + n
        if stop <= len(BUCKET_OF):
            return list(map(table.__getitem__, BUCKET_OF[first_match:stop]))
        last = table[-1]
        return [
            table[BUCKET_OF[m]] if m < len(BUCKET_OF) else last for m in range(first_match, stop)
        ]

    def path_scores(self, source: int, first_match: int, n: int) -> np.ndarray:
        """float32 running products of ``rate`` for match lengths first_match,
        first_match + 1, ... (n of them): each chain node's estimate that the chain up to
        it is accepted (multiplied in float64, left to right, then rounded)."""
        stop = first_match + n
        if stop <= len(BUCKET_OF):
            rates: Iterable[float] = map(
                self.table[source].__getitem__, BUCKET_OF[first_match:stop]
            )
        else:
            rates = self.rates(source, first_match, n)
        return np.frombuffer(array("f", accumulate(rates, mul)), np.float32)

    def observe(self, source: int, match_len: int, accepted: bool) -> None:
        """Record whether a copied token equalled the token the target committed."""
        b = bucket(match_len)
        hits, trials = self._hits[source], self._trials[source]
        hits[b] = hits[b] * self.decay + accepted
        trials[b] = trials[b] * self.decay + 1.0
        w = self.prior_weight
        estimate = (hits[b] + w * self._priors[source][b]) / (trials[b] + w)
        self.table[source][b] = self._rows[source, b] = estimate
