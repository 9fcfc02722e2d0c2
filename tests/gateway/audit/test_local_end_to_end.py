"""The records and audits through the real gateway app with the real local SmolLM2 target."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gateway.app import create_app
from gateway.audit.serve import serve_in_thread
from gateway.cli import app as cli
from gateway.config import build_settings
from sdk.wire.endpoints import AuditResult, EndpointList

pytestmark = pytest.mark.slow

CODE = "```python\ndef area(w, h):\n    return w * h\n```"
EDIT = {
    "id": "edit",
    "category": "code_edit",
    "messages": [
        {
            "role": "user",
            "content": "Repeat this code exactly, in a python code block:\n\n" + CODE,
        }
    ],
    "prediction": CODE,
    "max_tokens": 10,
}
JSON_ITEM = {
    "id": "json",
    "category": "json",
    "messages": [{"role": "user", "content": 'Answer with the JSON object {"a": 1}'}],
    "max_tokens": 6,
}


@pytest.fixture(scope="module")
def local_gateway(engine: Any) -> Iterator[str]:
    """The embedded default (one local endpoint on smollm2-135m, in-memory stores) on the
    session's shared engine."""
    app = create_app(build_settings({}, "test"), environ={}, engines={"local": engine})
    with serve_in_thread(app) as url:
        # the first request loads the model and measures step costs (minutes on a busy CPU)
        warm = {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        }
        assert httpx.post(f"{url}/v1/chat/completions", json=warm, timeout=900).status_code == 200
        yield url


def test_local_verifier_record_is_yes_from_its_usage_fields(local_gateway: str) -> None:
    resp = httpx.post(f"{local_gateway}/v1/endpoints/probe", json={}, timeout=600)
    assert resp.status_code == 200
    [record] = EndpointList.model_validate(resp.json()).data
    assert (record.name, record.kind) == ("local", "local")
    assert record.documented is not None and record.documented.accepts_prediction == "yes"
    assert record.enabled == "yes"
    assert record.enabled_evidence is not None
    assert record.enabled_evidence.source in ("usage fields", "traffic usage fields")
    assert record.enabled_evidence.values["accepted_prediction_tokens"] > 0
    assert record.latency is not None and record.latency.requests >= 1


def test_audit_through_the_gateway_is_consistent_and_lossless(local_gateway: str) -> None:
    body = {"endpoint": "local", "workload": [EDIT], "include_records": True}
    resp = httpx.post(f"{local_gateway}/v1/audits", json=body, timeout=900)
    assert resp.status_code == 200, resp.text
    result = AuditResult.model_validate(resp.json())
    assert [r["config"] for r in result.records] == ["drafts", "no_prediction", "baseline"]
    for r in result.records:
        assert r["error"] is None, r
        assert r["tokens_source"] == "usage"
        expected = (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
        assert r["tpot_s"] == pytest.approx(expected)
    drafts = result.records[0]
    assert drafts["prediction_header"] == "verified-locally"
    assert drafts["draft_stats"]["verify_steps"] >= 1
    baseline = result.records[2]
    assert baseline["draft_stats"]["drafted_tokens"] == 0
    # greedy decoding on the lossless local endpoint: same text with and without drafts
    assert {r["text"] for r in result.records} == {baseline["text"]}
    assert not any(row.mismatch for row in result.summary.lossless)
    assert result.summary.measured_evidence.kind == "measured"
    assert result.summary.memory and result.summary.memory.keys() >= {"weights_bytes"}
    # the three configs send one prompt: the later ones reuse its prefix (same tenant)
    assert sum(r["cached_tokens"] for r in result.records[1:]) > 0
    reuse = result.summary.prefix_cache
    assert sum(p.requests_with_hits for p in reuse) >= 2
    assert all(p.hit_rate is not None for p in reuse)

    listed = httpx.get(f"{local_gateway}/v1/endpoints", timeout=60).json()
    kinds = {e["kind"] for e in listed["data"][0]["evidence"]}
    assert "measured" in kinds


def test_cli_audit_against_a_running_gateway(local_gateway: str, tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(JSON_ITEM) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "audit",
            "local",
            "--base-url",
            local_gateway,
            "--workload",
            str(workload),
            "--out",
            str(out),
            "--concurrency",
            "1,4",
            "--requests",
            "4",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "TPOT" in result.output and "(e2e - TTFT) / (output_tokens - 1)" in result.output
    assert "by concurrency level" in result.output and "memory (local endpoint)" in result.output
    audit = AuditResult.model_validate_json((out / "audit.json").read_text())
    assert len(audit.records) == 2 * 2 * 4  # 2 levels x 2 configs x 4 requests
    assert [lv.concurrency for lv in audit.summary.levels] == [1, 4]
    # greedy on the local target: the same answers at concurrency 4 as alone, drafts or not
    same = audit.summary.identical_to_first_level
    assert {i.concurrency for i in same} == {1, 4}
    assert all(i.identical == i.pairs == 4 for i in same), same
    memory = audit.summary.memory
    assert memory is not None
    report = (out / "report.md").read_text()
    assert report.startswith("# Audit of endpoint `local`")
    assert "## By concurrency level" in report
    assert all(f"| {part} |" in report for part in memory)  # every part the engine reports
    assert (out / "speedup.png").exists()

    listing = CliRunner().invoke(cli, ["endpoints", "--json", "--base-url", local_gateway])
    assert listing.exit_code == 0, listing.output
    assert json.loads(listing.output)[0]["name"] == "local"
