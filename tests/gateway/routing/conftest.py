"""Two real ``draftgate verifier`` replicas of SmolLM2, shared by the routing tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.routing.processes import Process, verifier

MODEL = "smollm2-135m"


@pytest.fixture(scope="session")
def replicas() -> Iterator[dict[str, Process]]:
    """Replicas ``a`` and ``b`` (a test that kills one starts it again on its port)."""
    procs = {"a": verifier(), "b": verifier()}
    try:
        for p in procs.values():
            p.spawn()
        for p in procs.values():
            p.wait()
        yield procs
    finally:
        for p in procs.values():
            p.stop()
