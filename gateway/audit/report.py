"""``report.md``: the audit summary as Markdown, each metric next to its formula."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

from sdk.wire.audits import AuditSummary, Distribution
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


def _dist(d: Distribution, *qs: int) -> str:
    return " / ".join(_ms(getattr(d, f"p{q}")) for q in qs) + f" (n={d.n})"


def _setting(setting: str) -> str:
    return "" if setting == "default" else f" {setting}"


def _header(result: AuditResult) -> list[str]:
    plan = result.summary.plan
    when = dt.datetime.fromtimestamp(result.started_at, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC"
    )
    arrivals = f"Poisson arrivals at {plan.poisson_rate}/s" if plan.poisson_rate else "closed loop"
    return [
        f"# Audit of endpoint `{result.endpoint}` (model `{result.model}`)",
        "",
        f"Run {when}, {result.finished_at - result.started_at:.1f} s; kind `{plan.kind}`; "
        f"{plan.workload_items} workload items, {plan.requests_per_config} requests per "
        f"configuration per level; concurrency {plan.concurrency}; {arrivals}; "
        f"temperature {plan.temperature}; sweep {plan.sweep or 'none'}.",
        "",
        "Configurations: `drafts` = prediction (when the item has one) + documents, drafting on; "
        "`no_prediction` = drafting on without the prediction (code_edit only); "
        '`baseline` = no prediction and `"draftgate": {"draft": false}`.',
        "",
    ]


def _formulas(s: AuditSummary) -> list[str]:
    return [
        "## Metrics and their formulas",
        "",
        *_table(["metric", "formula"], [[k, v] for k, v in s.formulas.items()]),
    ]


def _runs(s: AuditSummary) -> list[str]:
    header = [
        "concurrency",
        "setting",
        "requests",
        "finished",
        "wall s",
        "output throughput tok/s",
        "request throughput req/s",
    ]
    rows = [
        [
            str(lv.concurrency),
            lv.setting,
            str(lv.requests),
            str(lv.finished),
            _num(lv.wall_s),
            _num(lv.output_throughput_tok_s),
            _num(lv.request_throughput_rps, 3),
        ]
        for lv in s.levels
    ]
    return ["## Runs", "", *_table(header, rows)]


def _by_concurrency(s: AuditSummary) -> list[str]:
    """Each concurrency level side by side: throughput and TTFT/TPOT/E2E percentiles, per
    config (only when the audit ran more than one level)."""
    if len(s.plan.concurrency) < 2:
        return []
    low = min(s.plan.concurrency)
    header = [
        "config",
        "conc",
        "output tok/s (run)",
        "TTFT p50/p99",
        "TPOT p50/p99",
        "E2E p50/p99",
        f"same as baseline at c={low}",
    ]
    walls = {(lv.concurrency, lv.setting): lv for lv in s.levels}
    same = {(i.config, i.setting, i.concurrency): i for i in s.identical_to_first_level}
    rows = []
    for g in sorted(s.all_categories(), key=lambda g: (g.config, g.setting, g.concurrency)):
        level = walls.get((g.concurrency, g.setting))
        throughput = g.output_tokens / level.wall_s if level and level.wall_s else None
        identity = same.get((g.config, g.setting, g.concurrency))
        rows.append(
            [
                g.config + _setting(g.setting),
                str(g.concurrency),
                _num(throughput, 1),
                _dist(g.ttft_s, 50, 99),
                _dist(g.tpot_s, 50, 99),
                _dist(g.e2e_s, 50, 99),
                f"{identity.identical}/{identity.pairs}" if identity else "-",
            ]
        )
    return [
        "## By concurrency level (all categories; ms)",
        "",
        "output tok/s (run) = the config's output tokens / wall time of its level's run "
        "(the configs of a level run interleaved, so they share that wall time).",
        "",
        *_table(header, rows),
    ]


def _latency(s: AuditSummary) -> list[str]:
    header = [
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
        "preempted (times)",
    ]
    rows = [
        [
            g.config,
            g.setting,
            str(g.concurrency),
            _dist(g.ttfb_s, 50, 95),
            _dist(g.ttft_s, 50, 95, 99),
            _dist(g.tpot_s, 50, 95),
            _dist(g.itl_s, 50, 99),
            _dist(g.e2e_s, 50, 95),
            _ms(g.queue_wait_s.p95),
            _num(g.tokens_per_chunk),
            _num(g.output_tok_s, 1),
            f"{g.preempted_requests} ({g.preemptions})",
        ]
        for g in s.all_categories()
    ]
    return [
        "## Latency per configuration (all categories; ms)",
        "",
        "TTFT holds waiting and prompt processing; TPOT and ITL hold generation; queue wait is "
        "the client's own and is not in TTFT. Preempted: answers whose KV blocks a local "
        "engine took back and recomputed (endpoint-reported).",
        "",
        *_table(header, rows),
    ]


def _categories(s: AuditSummary) -> list[str]:
    header = [
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
    ]
    rows = [
        [
            g.category,
            g.config,
            g.setting,
            str(g.concurrency),
            str(g.requests),
            _ms(g.ttft_s.p50),
            _ms(g.tpot_s.p50),
            _num(g.output_tok_s, 1),
            _num(g.acceptance.rate),
            _num(g.acceptance.accepted_per_step),
            str(sum(g.errors.values())),
        ]
        for g in s.groups
        if g.category != "all"
    ]
    return ["## Per category", "", *_table(header, rows)]


def _speedup(s: AuditSummary) -> list[str]:
    header = ["category", "config", "setting", "conc", "pairs", "tok/s with", "tok/s without"]
    rows = [
        [
            r.category,
            r.config,
            r.setting,
            str(r.concurrency),
            str(r.pairs),
            _num(r.tok_s_with, 1),
            _num(r.tok_s_without, 1),
            _num(r.speedup) + ("x" if r.speedup else ""),
        ]
        for r in s.speedup
    ]
    return [
        "## Speedup with vs without drafts",
        "",
        f"speedup = {s.formulas['speedup']}",
        "",
        *_table([*header, "speedup"], rows),
    ]


def _break_even(s: AuditSummary) -> list[str]:
    header = ["category", "config", "setting", "conc", "ms/token with", "ms/token without"]
    rows = [
        [
            r.category,
            r.config,
            r.setting,
            str(r.concurrency),
            _ms(r.t_with_s),
            _ms(r.t_without_s),
            r.statement,
        ]
        for r in s.break_even
    ]
    losing = [
        f"{r.category} ({r.config}, c={r.concurrency}, {r.setting})"
        for r in s.break_even
        if r.pays is False
    ]
    return [
        "## Break-even",
        "",
        f"time/token = {s.formulas['time/token']}; {s.formulas['break-even']}.",
        "",
        *_table([*header, "verdict"], rows),
        f"**Drafts do not pay in:** {', '.join(losing)}."
        if losing
        else "Drafts pay (or break even) in every cell measured.",
        "",
    ]


def _positions(s: AuditSummary) -> list[str]:
    groups = [g for g in s.all_categories() if g.acceptance.accepted_by_position]
    if not groups:
        return []
    rows = [
        [
            g.config,
            g.setting,
            str(g.concurrency),
            ", ".join(map(str, g.acceptance.accepted_by_position)),
        ]
        for g in groups
    ]
    return [
        "## Accepted draft tokens by draft position",
        "",
        *_table(["config", "setting", "conc", "accepted at position 1, 2, ..."], rows),
    ]


def _sources(s: AuditSummary) -> list[str]:
    groups = [g for g in s.all_categories() if g.acceptance.by_source]
    if not groups:
        return []
    rows = [
        [
            g.config,
            g.setting,
            str(g.concurrency),
            "; ".join(
                f"{name} {a.accepted}/{a.drafted} ({_num(a.rate)})"
                for name, a in g.acceptance.by_source.items()
            ),
        ]
        for g in groups
    ]
    return [
        "## Draft acceptance by source",
        "",
        f"{s.formulas.get('acceptance by source', '')}.",
        "",
        *_table(["config", "setting", "conc", "source accepted/verified (rate)"], rows),
    ]


def _quality(s: AuditSummary) -> list[str]:
    rows = [
        [
            q.category,
            q.config,
            "; ".join(f"{k} {v.passed}/{v.failed}" for k, v in q.checks.items()) or "-",
            str(q.truncated_at_max_tokens),
        ]
        for q in s.quality
    ]
    header = ["category", "config", "checks passed/failed", "stopped at max_tokens"]
    return ["## Output quality", "", *_table(header, rows)]


def _lossless(s: AuditSummary) -> list[str]:
    rows = [
        [
            r.category,
            r.config,
            r.setting,
            f"{r.identical}/{r.pairs}",
            "yes" if r.expected_identical else "no",
            "MISMATCH" if r.mismatch else "",
        ]
        for r in s.lossless
    ]
    header = ["category", "config", "setting", "identical / pairs", "expected identical", ""]
    return ["## Same answer with and without drafts", "", *_table(header, rows)]


def _languages(s: AuditSummary) -> list[str]:
    rows = [
        [
            r.language,
            r.config,
            str(r.requests),
            _num(r.acceptance_rate),
            _num(r.output_tok_s, 1),
            _num(r.chars_per_token),
        ]
        for r in s.languages
    ]
    header = ["language", "config", "n", "acceptance rate", "output tok/s", "chars/token"]
    return ["## Per language (multilingual and other tagged items)", "", *_table(header, rows)]


def _prefix_cache(s: AuditSummary) -> list[str]:
    lines = ["## Prefix reuse (usage.prompt_tokens_details.cached_tokens)", ""]
    if not s.prefix_cache:
        # a gateway keeps a vLLM or SGLang engine's counts to itself
        return [*lines, "not reported by this endpoint", ""]
    rows = [
        [
            p.config,
            str(p.concurrency),
            f"{p.cached_tokens:,}/{p.prompt_tokens:,}",
            _num(p.hit_rate),
            f"{p.requests_with_hits}/{p.requests_reporting}",
            _dist(p.ttft_hit_s, 50, 95),
            _dist(p.ttft_miss_s, 50, 95),
        ]
        for p in s.prefix_cache
    ]
    header = [
        "config",
        "concurrency",
        "cached / prompt tokens",
        "hit rate",
        "requests with hits",
        "TTFT with hits p50/p95 ms",
        "TTFT without p50/p95 ms",
    ]
    return [*lines, *_table(header, rows)]


def _memory(s: AuditSummary) -> list[str]:
    """Whatever parts the engine's ``memory()`` reports (bytes where the value is an int)."""
    lines = ["## Memory (local endpoint)", ""]
    if not s.memory:
        return [*lines, "not reported by this endpoint", ""]
    rows = [[k, f"{v:,}" if isinstance(v, int) else str(v)] for k, v in s.memory.items()]
    return [*lines, *_table(["part", "value"], rows)]


def _errors(s: AuditSummary) -> list[str]:
    errors = {**s.errors, **{f"setup:{k}": v for k, v in s.setup_errors.items()}}
    rows = [[k, str(v)] for k, v in sorted(errors.items())]
    return ["## Errors", "", *(_table(["error", "count"], rows) if errors else ["none", ""])]


def _evidence(s: AuditSummary) -> list[str]:
    ev = s.measured_evidence
    return ["## Evidence recorded for the endpoint", "", f"`{ev.verdict}`: {ev.detail}", ""]


def _plots(plots: Sequence[str]) -> list[str]:
    if not plots:
        return []
    return ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]


SECTIONS: tuple[Callable[[AuditSummary], list[str]], ...] = (
    _formulas,
    _runs,
    _by_concurrency,
    _latency,
    _categories,
    _speedup,
    _break_even,
    _positions,
    _sources,
    _quality,
    _lossless,
    _languages,
    _prefix_cache,
    _memory,
    _errors,
    _evidence,
)


def render(result: AuditResult, plots: Sequence[str] = ()) -> str:
    """The whole report: the header, then each section in order."""
    lines = _header(result)
    for section in SECTIONS:
        lines += section(result.summary)
    return "\n".join(lines + _plots(plots))


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
            result.summary.plots = str(exc)
    written += [out / n for n in names]
    report = out / "report.md"
    report.write_text(render(result, names), encoding="utf-8")
    return [*written, report]
