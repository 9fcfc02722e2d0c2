"""How long a response asks the client to wait: ``retry-after-ms`` or ``Retry-After``.

The one parser of these headers, used by the SDK's retries and by the gateway for its
upstreams. Whatever a server sends, the answer is a finite number of seconds in
``[0, cap]`` or None: ``inf`` and huge values become ``cap``, negative values and dates
in the past ``0``, ``nan`` and anything unreadable None (as if the header were absent).
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping


def retry_after_s(headers: Mapping[str, str], cap: float) -> float | None:
    """Seconds to wait before retrying, clamped to ``[0, cap]``; None when not given.

    ``retry-after-ms`` (OpenAI's, milliseconds) wins over ``Retry-After``, which is
    seconds or an HTTP date. ``headers`` should match names case-insensitively (as
    ``httpx.Headers`` does).
    """
    if (ms := _number(headers.get("retry-after-ms"))) is not None:
        return _clamp(ms / 1000, cap)
    value = headers.get("retry-after")
    if value is None:
        return None
    if (seconds := _number(value)) is not None:
        return _clamp(seconds, cap)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _clamp(when.timestamp() - time.time(), cap)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return None if math.isnan(number) else number


def _clamp(seconds: float, cap: float) -> float:
    return min(max(seconds, 0.0), cap)
