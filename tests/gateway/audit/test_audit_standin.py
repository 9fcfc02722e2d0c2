"""Audits end to end over real streaming HTTP against a stand-in OpenAI-format server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.audit.figures import FORMULAS
from gateway.audit.report import write_outputs
from gateway.audit.runner import AuditPlan, audit_client, run_audit
from gateway.audit.serve import serve_in_thread
from gateway.audit.workload import load_workload, parse_item
from gateway.stats import percentile
from sdk.wire.audits import CheckCount
from sdk.wire.endpoints import AuditResult
from tests.openai_standin import Script, StandIn

CODE = "```python\ndef rect_area(width, height):\n    return width * height\n```"
ITEMS = [
    parse_item(
        {
            "id": "edit",
            "category": "code_edit",
            "messages": [{"role": "user", "content": f"Rename area.\n\n{CODE}"}],
            "prediction": CODE,
            "max_tokens": 64,
        }
    ),
    parse_item(
        {
            "id": "json",
            "category": "json",
            "messages": [{"role": "user", "content": "Answer with JSON"}],
            "max_tokens": 64,
        }
    ),
    parse_item(
        {
            "id": "ko",
            "category": "multilingual",
            "messages": [{"role": "user", "content": "다음 문장을 영어로 번역하세요: 좋은 날"}],
            "max_tokens": 64,
        }
    ),
    *(
        parse_item(
            {
                "id": f"rep{i}",
                "category": "repeat",
                "series": "s",
                "messages": [{"role": "user", "content": f"JSON please {i}"}],
                "max_tokens": 32,
            }
        )
        for i in range(2)
    ),
]


async def _audit(url: str, **kw: object) -> AuditResult:
    """An audit of the stand-in at ``url`` through the SDK client, over HTTP."""
    async with audit_client(f"{url}/v1") as client:
        return await run_audit(_plan(**kw), client)


def _plan(**kw: object) -> AuditPlan:
    defaults: dict[str, object] = {
        "endpoint": "standin",
        "model": "m",
        "items": ITEMS,
        "kind": "local",
        "concurrency": (1, 2),
        "progress": False,
    }
    return AuditPlan(**{**defaults, **kw})  # type: ignore[arg-type]


async def test_audit_writes_consistent_figures(tmp_path: Path) -> None:
    standin = StandIn(Script(step_s=0.002, draft_per_step=4))
    with serve_in_thread(standin) as url:
        result = await _audit(url)
    paths = write_outputs(result, tmp_path)

    loaded = AuditResult.model_validate_json((tmp_path / "audit.json").read_text())
    assert len(loaded.records) == 2 * (3 * 1 + 2 * 4)  # 2 levels; code_edit has 3 configs
    assert {r["config"] for r in loaded.records} == {"drafts", "no_prediction", "baseline"}
    assert all(r["error"] is None for r in loaded.records)

    # TPOT recomputed from the raw records: (e2e - TTFT) / (output_tokens - 1)
    for r in loaded.records:
        if r["output_tokens"] >= 2:
            expected = (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
            assert r["tpot_s"] == pytest.approx(expected)
            assert r["e2e_s"] == r["chunk_offsets_s"][-1]
            assert r["ttft_s"] == r["chunk_offsets_s"][0]
    for g in loaded.summary.groups:
        rows = [
            r
            for r in loaded.records
            if (r["config"], r["setting"], r["concurrency"]) == (g.config, g.setting, g.concurrency)
            and g.category in ("all", r["category"])
        ]
        tpots = [r["tpot_s"] for r in rows if r["tpot_s"] is not None]
        assert g.tpot_s.p50 == percentile(tpots, 50)
        assert g.tpot_s.n == len(tpots)
        assert g.output_tokens == sum(r["output_tokens"] for r in rows)
        assert g.output_tok_s == pytest.approx(
            sum(r["output_tokens"] for r in rows) / sum(r["e2e_s"] for r in rows)
        )

    # the stand-in reports accepted prediction tokens only for drafted code edits
    edit = next(
        g
        for g in loaded.summary.groups
        if (g.category, g.config, g.concurrency) == ("code_edit", "drafts", 1)
    )
    assert edit.acceptance.rate == 1.0
    assert edit.tokens_per_chunk is not None and edit.tokens_per_chunk > 1

    speed = {(s.category, s.config, s.concurrency): s for s in loaded.summary.speedup}
    assert set(speed) >= {("code_edit", "drafts", 1), ("json", "drafts", 2), ("all", "drafts", 1)}
    assert {b.pays for b in loaded.summary.break_even} <= {True, False, None}

    quality = {(q.category, q.config): q.checks for q in loaded.summary.quality}
    assert quality[("code_edit", "drafts")]["python_parses"] == CheckCount(passed=2, failed=0)
    assert quality[("json", "baseline")]["json_valid"] == CheckCount(passed=2, failed=0)
    lossless = {(r.category, r.config): r for r in loaded.summary.lossless}
    assert lossless[("code_edit", "drafts")].identical == 2
    assert not any(r.mismatch for r in loaded.summary.lossless)

    # prefix reuse (the stand-in reports a repeated prompt as cached), from the raw records
    assert {(p.config, p.concurrency) for p in loaded.summary.prefix_cache} == {
        (c, n) for c in ("drafts", "no_prediction", "baseline") for n in (1, 2)
    }
    for p in loaded.summary.prefix_cache:
        rows = [
            r
            for r in loaded.records
            if (r["config"], r["concurrency"]) == (p.config, p.concurrency)
        ]
        hits = [r["ttft_s"] for r in rows if r["cached_tokens"]]
        misses = [r["ttft_s"] for r in rows if not r["cached_tokens"]]
        assert p.cached_tokens == sum(r["cached_tokens"] for r in rows)
        assert p.hit_rate == p.cached_tokens / sum(r["prompt_tokens"] for r in rows)
        assert (p.requests_with_hits, p.ttft_hit_s.n, p.ttft_miss_s.n) == (
            len(hits),
            len(hits),
            len(misses),
        )
        assert p.ttft_hit_s.p50 == percentile(hits, 50)
        assert p.ttft_miss_s.p50 == percentile(misses, 50)
    assert all(p.hit_rate == 1.0 for p in loaded.summary.prefix_cache if p.concurrency == 2)
    assert {r.language for r in loaded.summary.languages} == {"ko"}

    # series: each drafted answer became a document the next request of the series names
    assert any(k.startswith("audit-s-rep0-drafts") for k in standin.documents)
    rep1 = [
        b
        for b in standin.bodies()
        if "JSON please 1" in b["messages"][0]["content"]
        and (b.get("draftgate") or {}).get("draft", True)
    ]
    assert rep1 and all(any("rep0" in d for d in b["draftgate"]["documents"]) for b in rep1)
    baseline = [b for b in standin.bodies() if (b.get("draftgate") or {}).get("draft") is False]
    assert baseline and all("prediction" not in b for b in baseline)

    report = (tmp_path / "report.md").read_text()
    for name, formula in FORMULAS.items():
        assert f"| {name} | {formula} |" in report
    # both levels side by side, each config's TTFT p50/p99 as the summary has it
    by_level = report.split("## By concurrency level")[1].split("\n## ")[0]
    for g in loaded.summary.all_categories():
        assert f"| {g.config} | {g.concurrency} |" in by_level
        p50, p99 = g.ttft_s.p50, g.ttft_s.p99
        assert p50 is not None and p99 is not None
        assert f"{p50 * 1e3:.1f} / {p99 * 1e3:.1f} (n={g.ttft_s.n})" in by_level
    assert "## Memory (local endpoint)\n\nnot reported by this endpoint" in report
    prefix = report.split("## Prefix reuse")[1].split("\n## ")[0]
    for p in loaded.summary.prefix_cache:
        assert (
            f"| {p.config} | {p.concurrency} | {p.cached_tokens:,}/{p.prompt_tokens:,} |" in prefix
        )
    # the stand-in answers the same at every level: every answer equals the c=1 baseline's
    same = loaded.summary.identical_to_first_level
    assert {(i.concurrency, i.config) for i in same} == {
        (c, config) for c in (1, 2) for config in ("drafts", "no_prediction", "baseline")
    }
    assert all(i.identical == i.pairs > 0 for i in same)
    assert "same as baseline at c=1" in by_level
    for png in ("ttft.png", "tpot.png", "speedup.png"):
        assert (tmp_path / png) in paths
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_errors_mid_audit_are_counted_and_the_report_is_still_written(tmp_path: Path) -> None:
    standin = StandIn(
        Script(step_s=0.002, draft_per_step=4, http_error_every=3, stream_error_every=5)
    )
    with serve_in_thread(standin) as url:
        result = await _audit(url, concurrency=(1,), warmup=False)
    write_outputs(result, tmp_path)
    errors = result.summary.errors
    assert errors["http_503"] == len(standin.bodies()) // 3
    assert errors.get("stream_error:server_error", 0) >= 1
    assert sum(errors.values()) == sum(1 for r in result.records if r["error"])
    report = (tmp_path / "report.md").read_text()
    assert "| http_503 |" in report


async def test_an_endpoint_that_ignores_prediction_gets_no_measured_yes() -> None:
    standin = StandIn(Script(speculative=False, step_s=0.01, draft_per_step=4))
    items = [ITEMS[0]] * 4
    with serve_in_thread(standin) as url:
        result = await _audit(url, items=items, concurrency=(1,), kind="openai_compatible")
    assert result.summary.measured_evidence.verdict == "unknown"
    assert result.summary.lossless[0].expected_identical is False


async def test_a_drafting_endpoint_gets_measured_yes() -> None:
    standin = StandIn(Script(step_s=0.02, draft_per_step=8))
    with serve_in_thread(standin) as url:
        result = await _audit(url, items=ITEMS[:1], requests=6, concurrency=(1,))
    evidence = result.summary.measured_evidence
    assert evidence.verdict == "yes", evidence
    assert evidence.values["pairs"] == 6


async def test_sweep_and_poisson_arrivals_record_settings_and_client_queueing() -> None:
    standin = StandIn(Script(step_s=0.002, draft_per_step=4))
    with serve_in_thread(standin) as url:
        result = await _audit(
            url,
            items=ITEMS[:2],
            concurrency=(1,),
            sweep=("temperature", [0.0, 0.5]),
            poisson_rate=200.0,
            requests=3,
        )
    settings = {r["setting"] for r in result.records}
    assert settings == {"temperature=0", "temperature=0.5"}
    temps = {b.get("temperature") for b in standin.bodies() if b.get("max_tokens") != 4}
    assert temps == {0.0, 0.5}
    assert all(r["queued_s"] >= 0 for r in result.records)
    # per setting: edit (3 configs), json (2 configs), edit again (3 configs)
    assert len([r for r in result.records if r["setting"] == "temperature=0"]) == 8
    assert [lv.poisson_rate for lv in result.summary.levels] == [200.0, 200.0]


def test_builtin_workload_covers_every_category() -> None:
    items = load_workload()
    assert {i.category for i in items} == {
        "code_edit",
        "doc_qa",
        "json",
        "multilingual",
        "chat",
        "repeat",
    }
    assert json.dumps([i.id for i in items])
