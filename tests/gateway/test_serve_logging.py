"""``draftgate serve`` prints its own packages' log lines beside uvicorn's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EMIT = """
import logging, logging.config
from gateway.cli.serve import log_config
from uvicorn.config import LOGGING_CONFIG
logging.config.dictConfig({config})
logging.getLogger("gateway.endpoints.local.endpoint").info("local endpoint local: loaded")
logging.getLogger("local_verifier.kernels").info("forward step kernels")
logging.getLogger("lookup.corpus.corpus").debug("capture not started")
"""


def _stderr(config: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", EMIT.format(config=config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stderr


@pytest.mark.parametrize("level", ["info", "warning"])
def test_own_info_lines_reach_the_console_at_the_level(level: str) -> None:
    err = _stderr(f"log_config({level!r})")
    shown = level == "info"
    assert ("INFO:     local endpoint local: loaded" in err) is shown
    assert ("forward step kernels" in err) is shown
    assert "capture not started" not in err  # debug stays out


def test_uvicorn_alone_would_drop_them() -> None:
    assert "local endpoint local: loaded" not in _stderr("LOGGING_CONFIG")
