"""Summary statistics shared by the audit's metrics and the records' traffic roll-ups."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile: the ceil(q/100 * n)-th smallest value (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]
