"""The dashboard's audits against ``draftgate audit``: an audit started from the page and
the same audit from the command line, both through a gateway in front of the stand-in
with an ``audit_dir``. The page shows the figures of the report files its run wrote, the
same deterministic figures as the command line's report, and lists the command line's
run beside its own with its report and plots."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from gateway.app import create_app
from gateway.audit import folders
from gateway.cli import app as cli
from sdk.wire.endpoints import AuditResult
from tests.gateway.conftest import ENVIRON, standin_settings
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

WAIT_S = 120.0
ENDPOINT, CATEGORIES, REQUESTS = "openai", ["repeat", "json"], 2
AUDIT = {"endpoint": ENDPOINT, "categories": CATEGORIES, "requests": REQUESTS}


@pytest.fixture(scope="module")
def audit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audits")


@pytest.fixture(scope="module")
def url(standin_server: tuple[StandIn, str], audit_dir: Path) -> Iterator[str]:
    settings = standin_settings(standin_server[1], audit_dir=str(audit_dir))
    with serve(create_app(settings, environ=ENVIRON)) as served:
        yield served


@pytest.fixture(scope="module")
def ops(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as client:
        signed = client.post("/ui/login", json={"key": "ops-key"}, headers={"origin": url})
        assert signed.status_code == 200
        yield client


def _page_audit(ops: httpx.Client, url: str) -> str:
    """Start the audit from the page's form route; its id once it finished."""
    started = ops.post("/ui/audits", json={**AUDIT, "key": "ops-key"}, headers={"origin": url})
    assert started.status_code == 202, started.text
    run_id: str = started.json()["id"]
    deadline = time.monotonic() + WAIT_S
    while (state := ops.get(f"/ui/audit.json?id={run_id}").json())["state"] == "running":
        assert time.monotonic() < deadline, state
        time.sleep(0.05)  # polling the run's state, as the page's script does
    assert state["state"] == "done", state
    assert state["answered"] == state["total"] > 0
    return run_id


def cli_audit(url: str, tmp_path: Path, audit_dir: Path) -> str:
    """The same audit from the command line against the gateway at ``url``, its folder
    left to a configuration naming ``audit_dir``; the folder's name."""
    config = tmp_path / "draftgate.toml"
    config.write_text(f'audit_dir = "{audit_dir}"\n')
    before = set(folders.names(audit_dir))
    result = CliRunner().invoke(
        cli,
        [
            "audit",
            ENDPOINT,
            "--categories",
            ",".join(CATEGORIES),
            "--requests",
            str(REQUESTS),
            "--base-url",
            url,
            "--api-key",
            "ops-key",
            "--config",
            str(config),
        ],
    )
    assert result.exit_code == 0, result.output
    (name,) = set(folders.names(audit_dir)) - before
    return name


def _report(html: str) -> str:
    return html.split('<article id="report" class="report">')[1].split("</article>")[0]


def _report_md_as_html(folder: Path) -> str:
    """The folder's report.md as HTML without its section of PNG plots (the page draws
    them as SVG)."""
    text = (folder / "report.md").read_text(encoding="utf-8").split("\n## Plots\n")[0]
    html: str = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return html


def _deterministic(result: AuditResult) -> dict[str, Any]:
    """What two runs of one audit on the stand-in must share exactly: counts, tokens,
    identical answers, quality checks, every answer's text."""
    s = result.summary
    return {
        "plan": s.plan.model_dump(),
        "groups": sorted(
            (
                g.category,
                g.config,
                g.setting,
                g.concurrency,
                g.requests,
                g.finished,
                g.output_tokens,
                sorted(g.errors.items()),
            )
            for g in s.groups
        ),
        "lossless": sorted((x.category, x.config, x.identical, x.pairs) for x in s.lossless),
        "speedup_pairs": sorted((x.category, x.config, x.pairs) for x in s.speedup),
        "quality": sorted(repr(q.model_dump()) for q in s.quality),
        "answers": sorted(
            (r["item"], r["config"], r["concurrency"], r["text"]) for r in result.records
        ),
    }


def test_an_audit_from_the_page_matches_the_command_line(
    url: str, ops: httpx.Client, audit_dir: Path, tmp_path: Path
) -> None:
    page_id = _page_audit(ops, url)
    cli_id = cli_audit(url, tmp_path, audit_dir)
    page_result = folders.load(audit_dir / page_id / folders.RESULT)  # the page's run's files
    cli_result = folders.load(audit_dir / cli_id / folders.RESULT)
    assert _deterministic(page_result) == _deterministic(cli_result)
    identical = sum(x.identical for x in cli_result.summary.lossless)
    pairs = sum(x.pairs for x in cli_result.summary.lossless)
    assert pairs > 0

    for run_id, result in ((page_id, page_result), (cli_id, cli_result)):
        page = ops.get(f"/ui/audit?id={run_id}")
        assert page.status_code == 200
        # the headline: the same identical count as both reports
        assert f'<span id="identical">{identical} of {pairs} pairs identical</span>' in page.text
        # the whole report, as the run's own report.md has every figure
        assert _report(page.text) == _report_md_as_html(audit_dir / run_id)
        for x in result.summary.speedup:
            shown = "–" if x.speedup is None else f"{x.speedup:.2f}×"
            row = (
                f"<tr><td>{x.category}</td><td>{x.config}</td><td>{x.concurrency}</td>"
                f"<td>{x.setting}</td><td>{x.pairs}</td>\n<td>{shown}</td></tr>"
            )
            assert row in page.text
        # its plots as SVG, drawn from the run's records
        names = ["ttft.svg", "tpot.svg", "speedup.svg"]
        for name in names:
            assert f"name={name}" in page.text
            plot = ops.get(f"/ui/audit/plot?id={run_id}&name={name}")
            assert plot.status_code == 200
            assert plot.headers["content-type"] == "image/svg+xml"
            assert "script-src" not in plot.headers["content-security-policy"]
            assert b"<svg" in plot.content and b"<script" not in plot.content
        # the command line's PNGs beside its report
        assert (audit_dir / run_id / "speedup.png").read_bytes()[:4] == b"\x89PNG"

    listing = ops.get("/ui/audits").text
    rows = {
        run_id: listing.split(f'<tr data-run="{run_id}">')[1].split("</tr>")[0]
        for run_id in (page_id, cli_id)
    }
    assert "<td>this page</td>" in rows[page_id] and "<td>audit_dir</td>" in rows[cli_id]
    for row in rows.values():
        assert "<td>openai</td>" in row and "<td>done</td>" in row
        assert f"<td>{identical}/{pairs}</td>" in row
        assert "json, repeat; concurrency 1; 2 requests per configuration" in row


def test_a_broken_or_foreign_folder_is_no_audit(
    ops: httpx.Client, audit_dir: Path, tmp_path: Path
) -> None:
    broken = audit_dir / "broken-run"
    broken.mkdir()
    (broken / folders.RESULT).write_text("{not json", encoding="utf-8")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / folders.RESULT).write_text("{}", encoding="utf-8")
    listing = ops.get("/ui/audits")
    assert listing.status_code == 200 and 'data-run="broken-run"' not in listing.text
    for run_id in ("broken-run", f"../{tmp_path.name}/elsewhere", ".", "..", "%2e%2e"):
        page = ops.get("/ui/audit", params={"id": run_id})
        assert page.status_code == 404, run_id
        assert "Traceback" not in page.text
        assert ops.get("/ui/audit.json", params={"id": run_id}).status_code == 404
