"""Requests submitted at once: a test's steps must not depend on how fast its thread submits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from local_verifier.engine import Engine


@contextmanager
def together(engine: Engine) -> Iterator[None]:
    """What is submitted inside reaches the engine thread in one batch, admitted in one step:
    the engine takes its inbox under the lock held here (re-entrant, as ``submit`` takes it)."""
    with engine._cond:
        yield
