"""Audits count the answers a local engine preempted, from the endpoints' ``draftgate`` stats."""

from __future__ import annotations

from typing import Any

from gateway.audit.client import RequestRecord
from gateway.audit.metrics import FORMULAS, group_stats
from gateway.audit.report import _latency
from sdk.wire.audits import AuditSummary


def _record(stats: dict[str, Any] | None) -> RequestRecord:
    rec = RequestRecord(item="i", category="code", config="c", setting="s", concurrency=1, round=0)
    rec.ttft_s, rec.e2e_s, rec.output_tokens, rec.draft_stats = 0.1, 0.5, 8, stats
    return rec


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
