"""``draftgate audit``'s progress: plain lines on stderr when stderr is no terminal, the
summary alone on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.audit.serve import serve_in_thread
from gateway.cli import app as cli
from tests.openai_standin import Script, StandIn

ITEM = {
    "id": "json",
    "category": "json",
    "messages": [{"role": "user", "content": "Answer with JSON"}],
    "max_tokens": 16,
}


def test_audit_prints_progress_lines_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):  # a CI runner may force a terminal
        monkeypatch.delenv(name, raising=False)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(ITEM) + "\n")
    standin = StandIn(Script(step_s=0.0))
    with serve_in_thread(standin) as url:
        result = CliRunner().invoke(
            cli,
            [
                "audit",
                "standin",
                "--base-url",
                url,
                "--workload",
                str(workload),
                "--requests",
                "5",
                "--concurrency",
                "1,2",
                "--no-plots",
                "--out",
                str(tmp_path / "out"),
            ],
        )
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "audit standin: warm-up and documents: 0/1"
    assert lines[1].startswith("audit standin: warm-up and documents: 1/1 in ")
    # 2 levels x 5 requests x 2 configurations (drafts, baseline): a line per tenth
    assert lines[2] == "audit standin: 0/20"
    assert lines[3:-1] == [f"audit standin: {n}/20 ({5 * n}%)" for n in range(2, 20, 2)]
    assert lines[-1].startswith("audit standin: 20/20 in ")
    assert "audit standin:" not in result.stdout  # the summary's stream has no progress
    assert "metrics and formulas" in result.stdout
