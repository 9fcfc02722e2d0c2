"""Audits sum what the endpoints report in their ``draftgate`` stats: draft acceptance per
source and the answers a local engine preempted."""

from __future__ import annotations

from typing import Any

from gateway.audit.client import RequestRecord
from gateway.audit.figures import FORMULAS, group_stats
from gateway.audit.report import _latency, _sources
from sdk.wire.audits import AuditSummary


def _record(stats: dict[str, Any] | None) -> RequestRecord:
    rec = RequestRecord(item="i", category="code", config="c", setting="s", concurrency=1, round=0)
    rec.ttft_s, rec.e2e_s, rec.output_tokens, rec.draft_stats = 0.1, 0.5, 8, stats
    return rec


def test_acceptance_is_summed_per_source_over_requests() -> None:
    records = [
        _record(
            {
                "drafted_by_source": {"retrieved": 10, "prompt": 4},
                "accepted_by_source": {"retrieved": 8, "prompt": 1},
            }
        ),
        _record({"drafted_by_source": {"retrieved": 6, "answer": 5}, "accepted_by_source": {}}),
        _record(None),  # an endpoint that reports no draft stats
    ]
    by_source = group_stats(
        records, config="c", setting="s", concurrency=1, category="all"
    ).acceptance.by_source
    assert list(by_source) == ["answer", "prompt", "retrieved"]
    assert (by_source["retrieved"].drafted, by_source["retrieved"].accepted) == (16, 8)
    assert by_source["retrieved"].rate == 0.5
    assert by_source["prompt"].rate == 0.25
    assert (by_source["answer"].accepted, by_source["answer"].rate) == (0, 0.0)


def test_the_report_has_a_row_per_group_with_each_source() -> None:
    stats = group_stats(
        [_record({"drafted_by_source": {"retrieved": 4}, "accepted_by_source": {"retrieved": 3}})],
        config="drafts",
        setting="s",
        concurrency=2,
        category="all",
    )
    summary = AuditSummary.model_construct(formulas=FORMULAS, groups=[stats])
    lines = _sources(summary)
    assert lines[0] == "## Draft acceptance by source"
    assert "| drafts | s | 2 | retrieved 3/4 (0.75) |" in lines


def test_no_draft_stats_no_sources() -> None:
    stats = group_stats([_record(None)], config="c", setting="s", concurrency=1, category="all")
    assert stats.acceptance.by_source == {}


def test_preempted_answers_and_preemptions_are_summed() -> None:
    records = [
        _record({"preemptions": 2}),
        _record({"preemptions": 0}),
        _record({"preemptions": 1}),
    ]
    records += [_record(None), _record({})]  # endpoints that report no preemptions
    stats = group_stats(records, config="c", setting="s", concurrency=4, category="all")
    assert (stats.preempted_requests, stats.preemptions) == (2, 3)


def test_the_latency_table_shows_them() -> None:
    stats = group_stats(
        [_record({"preemptions": 3})], config="local", setting="s", concurrency=2, category="all"
    )
    lines = _latency(AuditSummary.model_construct(formulas=FORMULAS, groups=[stats]))
    header = next(line for line in lines if line.startswith("| config"))
    row = next(line for line in lines if line.startswith("| local"))
    assert header.rstrip(" |").endswith("preempted (times)")
    assert row.rstrip(" |").endswith("1 (3)")
