"""The benchmark workload the project ships (``benchmarks/workloads/default.jsonl``)."""

from __future__ import annotations

import json
from collections import Counter

from gateway.audit.workload import load_workload
from tests.conftest import WORKLOAD

FIELDS = {"id", "category", "source", "instruction", "messages", "prediction", "documents"}


def test_every_category_with_several_requests_and_two_series() -> None:
    rows = [json.loads(line) for line in WORKLOAD.read_text(encoding="utf-8").splitlines()]
    assert all(FIELDS | {"series", "max_tokens"} <= row.keys() for row in rows)
    assert len({row["id"] for row in rows}) == len(rows)
    counts = Counter(row["category"] for row in rows)
    assert counts["code_edit"] >= 9
    assert all(counts[c] >= 3 for c in ("doc_qa", "json", "multilingual", "chat", "repeat"))
    series = Counter(row["series"] for row in rows if row["series"])
    assert series == {"json-packages": counts["json"], "tickets": counts["repeat"]}
    for row in rows:
        if row["category"] == "code_edit":
            assert row["source"].startswith("cpython-3.11/Lib/")
            assert row["prediction"] in row["messages"][-1]["content"]  # the code being edited
        if row["category"] == "doc_qa":
            assert all(d["text"] in row["messages"][-1]["content"] for d in row["documents"])


def test_the_audit_reads_it() -> None:
    items = load_workload(WORKLOAD)
    assert {item.category for item in items} >= {"code_edit", "json", "repeat"}
