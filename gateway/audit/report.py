"""``report.md``: the audit summary as Markdown, each metric next to its formula."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sdk.wire.endpoints import AuditResult


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return [*out, ""]


def _dist(d: dict[str, Any], *qs: int) -> str:
    return " / ".join(_ms(d.get(f"p{q}")) for q in qs) + f" (n={d.get('n', 0)})"


def render(result: AuditResult, plots: Sequence[str] = ()) -> str:
    """The whole report."""
    s = result.summary
    plan = s.get("plan", {})
    when = dt.datetime.fromtimestamp(result.started_at, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
    lines = [
        f"# Audit of endpoint `{result.endpoint}` (model `{result.model}`)",
        "",
        f"Run {when}, {result.finished_at - result.started_at:.1f} s; kind `{plan.get('kind')}`; "
        f"{plan.get('workload_items')} workload items, {plan.get('requests_per_config')} requests per "
        f"configuration per level; concurrency {plan.get('concurrency')}; "
        f"{'Poisson arrivals at ' + str(plan.get('poisson_rate')) + '/s' if plan.get('poisson_rate') else 'closed loop'}; "
        f"temperature {plan.get('temperature')}; sweep {plan.get('sweep') or 'none'}.",
        "",
        "Configurations: `drafts` = prediction (when the item has one) + documents, drafting on; "
        "`no_prediction` = drafting on without the prediction (code_edit only); "
        '`baseline` = no prediction and `"draftgate": {"draft": false}`.',
        "",
        "## Metrics and their formulas",
        "",
        *_table(["metric", "formula"], [[k, v] for k, v in s["formulas"].items()]),
        "## Runs",
        "",
        *_table(
            [
                "concurrency",
                "setting",
                "requests",
                "finished",
                "wall s",
                "output throughput tok/s",
                "request throughput req/s",
            ],
            [
                [
                    str(lv["concurrency"]),
                    lv["setting"],
                    str(lv["requests"]),
                    str(lv["finished"]),
                    _num(lv["wall_s"]),
                    _num(lv["output_throughput_tok_s"]),
                    _num(lv["request_throughput_rps"], 3),
                ]
                for lv in s["levels"]
            ],
        ),
        "## Latency per configuration (all categories; ms)",
        "",
        "TTFT holds waiting and prompt processing; TPOT and ITL hold generation; queue wait is "
        "the client's own and is not in TTFT.",
        "",
        *_table(
            [
                "config",
                "setting",
                "conc",
                "TTFB p50/p95",
                "TTFT p50/p95/p99",
                "TPOT p50/p95",
                "ITL p50/p99",
                "E2E p50/p95",
                "queue wait p95",
                "tokens/chunk",
                "output tok/s",
            ],
            [
                [
                    g["config"],
                    g["setting"],
                    str(g["concurrency"]),
                    _dist(g["ttfb_s"], 50, 95),
                    _dist(g["ttft_s"], 50, 95, 99),
                    _dist(g["tpot_s"], 50, 95),
                    _dist(g["itl_s"], 50, 99),
                    _dist(g["e2e_s"], 50, 95),
                    _ms(g["queue_wait_s"].get("p95")),
                    _num(g["tokens_per_chunk"]),
                    _num(g["output_tok_s"], 1),
                ]
                for g in s["groups"]
                if g["category"] == "all"
            ],
        ),
        "## Per category",
        "",
        *_table(
            [
                "category",
                "config",
                "setting",
                "conc",
                "n",
                "TTFT p50 ms",
                "TPOT p50 ms",
                "output tok/s",
                "acceptance rate",
                "accepted/step",
                "errors",
            ],
            [
                [
                    g["category"],
                    g["config"],
                    g["setting"],
                    str(g["concurrency"]),
                    str(g["requests"]),
                    _ms(g["ttft_s"]["p50"]),
                    _ms(g["tpot_s"]["p50"]),
                    _num(g["output_tok_s"], 1),
                    _num(g["acceptance"]["rate"]),
                    _num(g["acceptance"]["accepted_per_step"]),
                    str(sum(g["errors"].values())),
                ]
                for g in s["groups"]
                if g["category"] != "all"
            ],
        ),
        "## Speedup with vs without drafts",
        "",
        f"speedup = {s['formulas']['speedup']}",
        "",
        *_table(
            [
                "category",
                "config",
                "setting",
                "conc",
                "pairs",
                "tok/s with",
                "tok/s without",
                "speedup",
            ],
            [
                [
                    r["category"],
                    r["config"],
                    r["setting"],
                    str(r["concurrency"]),
                    str(r["pairs"]),
                    _num(r["tok_s_with"], 1),
                    _num(r["tok_s_without"], 1),
                    _num(r["speedup"]) + ("x" if r["speedup"] else ""),
                ]
                for r in s["speedup"]
            ],
        ),
        "## Break-even",
        "",
        f"time/token = {s['formulas']['time/token']}; {s['formulas']['break-even']}.",
        "",
        *_table(
            [
                "category",
                "config",
                "setting",
                "conc",
                "ms/token with",
                "ms/token without",
                "verdict",
            ],
            [
                [
                    r["category"],
                    r["config"],
                    r["setting"],
                    str(r["concurrency"]),
                    _ms(r["t_with_s"]),
                    _ms(r["t_without_s"]),
                    r["statement"],
                ]
                for r in s["break_even"]
            ],
        ),
    ]
    losing = [
        f"{r['category']} ({r['config']}, c={r['concurrency']}, {r['setting']})"
        for r in s["break_even"]
        if r["pays"] is False
    ]
    lines += [
        f"**Drafts do not pay in:** {', '.join(losing)}."
        if losing
        else "Drafts pay (or break even) in every cell measured.",
        "",
    ]
    positions = [
        g for g in s["groups"] if g["category"] == "all" and g["acceptance"]["accepted_by_position"]
    ]
    if positions:
        lines += ["## Accepted draft tokens by draft position", ""]
        lines += _table(
            ["config", "setting", "conc", "accepted at position 1, 2, ..."],
            [
                [
                    g["config"],
                    g["setting"],
                    str(g["concurrency"]),
                    ", ".join(map(str, g["acceptance"]["accepted_by_position"])),
                ]
                for g in positions
            ],
        )
    lines += ["## Output quality", ""]
    lines += _table(
        ["category", "config", "checks passed/failed", "stopped at max_tokens"],
        [
            [
                q["category"],
                q["config"],
                "; ".join(f"{k} {v['passed']}/{v['failed']}" for k, v in q["checks"].items())
                or "-",
                str(q["truncated_at_max_tokens"]),
            ]
            for q in s["quality"]
        ],
    )
    lines += ["## Same answer with and without drafts", ""]
    lines += _table(
        ["category", "config", "setting", "identical / pairs", "expected identical", ""],
        [
            [
                r["category"],
                r["config"],
                r["setting"],
                f"{r['identical']}/{r['pairs']}",
                "yes" if r["expected_identical"] else "no",
                "MISMATCH" if r["mismatch"] else "",
            ]
            for r in s["lossless"]
        ],
    )
    lines += ["## Per language (multilingual and other tagged items)", ""]
    lines += _table(
        ["language", "config", "n", "acceptance rate", "output tok/s", "chars/token"],
        [
            [
                r["language"],
                r["config"],
                str(r["requests"]),
                _num(r["acceptance_rate"]),
                _num(r["output_tok_s"], 1),
                _num(r["chars_per_token"]),
            ]
            for r in s["languages"]
        ],
    )
    lines += ["## Memory (local endpoint)", ""]
    memory = s.get("memory")
    lines += (
        _table(
            ["part", "bytes"],
            [[k, f"{v:,}" if isinstance(v, int) else str(v)] for k, v in memory.items()],
        )
        if memory
        else ["not reported by this endpoint", ""]
    )
    lines += ["## Errors", ""]
    errors = {**s["errors"], **{f"setup:{k}": v for k, v in s.get("setup_errors", {}).items()}}
    lines += (
        _table(["error", "count"], [[k, str(v)] for k, v in sorted(errors.items())])
        if errors
        else ["none", ""]
    )
    ev = s.get("measured_evidence") or {}
    lines += [
        "## Evidence recorded for the endpoint",
        "",
        f"`{ev.get('verdict')}`: {ev.get('detail')}",
        "",
    ]
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(lines)


def write_outputs(result: AuditResult, out: Path, *, plots: bool = True) -> list[Path]:
    """Write ``audit.json`` (every request's record + summary), the PNG plots and
    ``report.md`` into ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "audit.json"]
    written[0].write_text(result.model_dump_json(indent=1), encoding="utf-8")
    names: list[str] = []
    if plots:
        from gateway.audit.plots import write_plots

        try:
            names = write_plots(result, out)
        except RuntimeError as exc:  # matplotlib missing: the report says so
            result.summary["plots"] = str(exc)
    written += [out / n for n in names]
    report = out / "report.md"
    report.write_text(render(result, names), encoding="utf-8")
    return [*written, report]
