"""``draftgate serve``'s model-loading progress: a log line as a load starts, a live line on
a terminal until every load has ended."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
from rich.console import Console

from gateway.app import create_app
from gateway.cli.load_progress import watch_loads
from gateway.config import build_settings
from gateway.runtime import Runtime


def _runtime(model: str) -> Runtime:
    endpoint = {"name": "local", "kind": "local", "model": model, "models": ["m"]}
    app = create_app(build_settings({"endpoints": [endpoint], "auth": False}, "test"))
    runtime: Runtime = app.state.runtime
    return runtime


async def test_a_load_is_logged_and_shown_live_until_it_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "missing.gguf")  # fails at once: the load still ends
    runtime = _runtime(missing)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    thread = watch_loads(runtime.local, console=console)
    assert thread is not None
    with caplog.at_level(logging.INFO, logger="gateway"):
        await runtime.start()
        thread.join(timeout=60)
    assert not thread.is_alive()
    assert runtime.local["local"].state == "failed"
    assert f"local endpoint local: loading {missing}" in caplog.text
    shown = screen.getvalue()
    assert "\x1b[" in shown and "1/1" in shown  # the live line, the load counted
    await runtime.aclose()


def test_not_a_terminal_gets_the_log_lines_only(tmp_path: Path) -> None:
    runtime = _runtime(str(tmp_path / "missing.gguf"))
    screen = io.StringIO()
    thread = watch_loads(runtime.local, console=Console(file=screen))
    assert thread is not None
    runtime.local["local"].start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert screen.getvalue() == ""
    runtime.local["local"].close()
