"""Two real ``draftgate verifier`` replicas, shared by the routing tests.

They serve the tiny random-weight checkpoint: what these tests prove (spreading, failover,
ejection, state shared between gateways) is the gateway's and the processes', not the
model's, and the tiny model loads in seconds where SmolLM2 takes a minute of the default
run (the real SmolLM2 runs end to end in ``tests/gateway/test_local.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.routing.processes import Process, verifier
from tests.local_verifier.conftest import write_tiny_checkpoint

MODEL = "tiny-replica"  # the checkpoint directory's name, the model name a verifier serves


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's directory, named ``MODEL``."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("replicas") / MODEL)


@pytest.fixture(scope="session")
def replicas(checkpoint: Path) -> Iterator[dict[str, Process]]:
    """Replicas ``a`` and ``b`` (a test that kills one starts it again on its port)."""
    procs = {"a": verifier(str(checkpoint)), "b": verifier(str(checkpoint))}
    try:
        for p in procs.values():
            p.spawn()
        for p in procs.values():
            p.wait()
        yield procs
    finally:
        for p in procs.values():
            p.stop()
