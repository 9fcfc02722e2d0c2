"""``max_batch`` of a local endpoint (``draftgate verifier --max-batch``) caps the requests
its engine runs at once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.app import create_app
from gateway.cli.serve import verifier_settings


def test_max_batch_reaches_the_engine(checkpoint: Path) -> None:
    app = create_app(verifier_settings(str(checkpoint), max_batch=3), environ={})
    local = app.state.runtime.local["local"]
    try:
        engine = asyncio.run(local.engine())
        assert engine._scheduler.max_batch == 3
    finally:
        local.close()
