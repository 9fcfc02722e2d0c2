"""An audit as the dashboard shows it: its headline, its report (``report.md`` rendered
as HTML) and its plots as SVG (the ``report`` extra's matplotlib)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

from gateway.audit.report import render
from sdk.wire.endpoints import AuditResult

_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")


def headline(result: AuditResult | None) -> dict[str, Any]:
    """Speedup per category (drafts on vs off) and how many answers with drafts were
    identical to those without."""
    if result is None:
        return {"speedup": [], "identical": None, "pairs": None}
    summary = result.summary
    return {
        "speedup": [
            {
                "category": s.category,
                "config": s.config,
                "concurrency": s.concurrency,
                "setting": s.setting,
                "pairs": s.pairs,
                "speedup": s.speedup,
            }
            for s in summary.speedup
        ],
        "identical": sum(x.identical for x in summary.lossless),
        "pairs": sum(x.pairs for x in summary.lossless),
    }


def report_html(result: AuditResult) -> str:
    """The run's ``report.md`` as HTML, but for its section of PNG plots (the page shows
    the plots as SVG); the text is escaped (no raw HTML passes)."""
    html: str = _markdown.render(render(result))
    return html


def svg_plots(result: AuditResult) -> dict[str, bytes]:
    """The audit's plots as SVG by name (drawn from its records); none without matplotlib."""
    from gateway.audit.plots import write_plots

    with tempfile.TemporaryDirectory() as tmp:
        try:
            names = write_plots(result, Path(tmp), fmt="svg")
        except RuntimeError:  # no matplotlib: the page shows the figures without plots
            return {}
        return {name: (Path(tmp) / name).read_bytes() for name in names}
