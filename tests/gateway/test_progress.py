"""Progress: plain lines where the output is no terminal, a live rich bar on one."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
from rich.console import Console

from gateway.progress import progress, track

TERMINAL_OVERRIDES = ("FORCE_COLOR", "TTY_COMPATIBLE")
"""Variables that make rich treat any output as a terminal (a CI runner may set them)."""


@pytest.fixture(autouse=True)
def _no_terminal_override(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TERMINAL_OVERRIDES:
        monkeypatch.delenv(name, raising=False)


def test_plain_lines_on_stderr_when_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(track(range(20), "bench c=1")) == list(range(20))
    out, err = capsys.readouterr()
    assert out == ""  # a result stream on stdout stays clean
    lines = err.splitlines()
    assert lines[0] == "bench c=1: 0/20"
    assert lines[1:-1] == [f"bench c=1: {n}/20 ({5 * n}%)" for n in range(2, 20, 2)]
    assert re.fullmatch(r"bench c=1: 20/20 in \d+\.\d s", lines[-1])
    assert "\x1b" not in err  # no terminal control codes in a log file


def test_unknown_total_gives_a_line_per_item(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("loading", None) as task:
        task.advance()
        task.advance(2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == ["loading: 0", "loading: 1", "loading: 3"]
    assert lines[3].startswith("loading: 3 in ")


def test_disabled_shows_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with progress("quiet", 3, enabled=False) as task:
        task.advance(3)
    assert capsys.readouterr() == ("", "")


def test_a_pipe_gets_plain_lines() -> None:
    code = "from gateway.progress import track\nfor _ in track(range(3), 'piped'): pass\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout == ""
    assert done.stderr.splitlines()[0] == "piped: 0/3"
    assert done.stderr.splitlines()[-1].startswith("piped: 3/3 in ")


def test_a_terminal_gets_a_live_bar() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with progress("audit local", 4, console=console) as task:
        for _ in range(4):
            task.advance()
    shown = screen.getvalue()
    assert "\x1b[" in shown  # drawn with terminal control codes
    assert "━" in shown  # the bar
    assert "audit local" in shown and "4/4" in shown
    assert "audit local: 0/4" not in shown  # not the plain lines
