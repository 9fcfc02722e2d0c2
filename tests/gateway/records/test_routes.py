"""``GET /v1/endpoints`` and ``POST /v1/audits`` on the real gateway app in front of the
gateway tests' stand-in upstream (an OpenAI-kind endpoint and a vLLM-kind one that
ignores ``prediction``)."""

from __future__ import annotations

import httpx

ALICE = {"authorization": "Bearer alice-key"}
OPS = {"authorization": "Bearer ops-key"}  # an admin key


def _record(data: dict[str, object], name: str) -> dict[str, object]:
    return next(r for r in data["data"] if r["name"] == name)  # type: ignore[index, union-attr]


def test_records_need_a_gateway_key(gateway_url: str) -> None:
    resp = httpx.get(f"{gateway_url}/v1/endpoints")
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"


def test_records_list_every_endpoint_with_its_documented_row(gateway_url: str) -> None:
    assert httpx.get(f"{gateway_url}/v1/endpoints", headers=ALICE).status_code == 403
    resp = httpx.get(f"{gateway_url}/v1/endpoints", headers=OPS)
    assert resp.status_code == 200
    data = resp.json()
    assert {r["name"] for r in data["data"]} >= {"openai", "vllm", "azure", "dead"}
    assert _record(data, "vllm")["documented"]["provider"] == "vLLM"  # type: ignore[index]
    assert _record(data, "azure")["documented"]["accepts_prediction"] == "partial"  # type: ignore[index]


def test_probes_never_call_an_endpoint_that_ignores_prediction_yes(gateway_url: str) -> None:
    resp = httpx.post(f"{gateway_url}/v1/endpoints/probe", headers=OPS, json={}, timeout=120)
    assert resp.status_code == 200
    data = resp.json()
    vllm = _record(data, "vllm")
    assert vllm["enabled"] != "yes"
    assert vllm["evidence"]  # the probe left its (non-)evidence
    assert _record(data, "dead")["enabled"] != "yes"


def test_audit_requests_are_validated(gateway_url: str) -> None:
    url = f"{gateway_url}/v1/audits"
    bad_json = httpx.post(
        url, content=b"{nope", headers={**OPS, "content-type": "application/json"}
    )
    assert bad_json.status_code == 400
    assert bad_json.json()["error"]["code"] == "invalid_json"
    empty = httpx.post(url, json={"endpoint": "vllm", "concurrency": []}, headers=OPS)
    assert empty.status_code == 400
    assert empty.json()["error"]["param"] == "concurrency"
    unknown = httpx.post(url, json={"endpoint": "nope"}, headers=OPS)
    assert unknown.status_code == 404
    sweep = httpx.post(url, json={"endpoint": "vllm", "sweep": {"top_p": [1.0]}}, headers=OPS)
    assert sweep.status_code == 400
    assert sweep.json()["error"]["param"] == "sweep"


def test_an_audit_of_an_endpoint_that_ignores_prediction_records_no_yes(gateway_url: str) -> None:
    item = {
        "id": "edit",
        "category": "code_edit",
        "messages": [
            {"role": "user", "content": "Rename f to g:\n```python\ndef f():\n    pass\n```"}
        ],
        "prediction": "```python\ndef g():\n    pass\n```",
        "max_tokens": 16,
    }
    resp = httpx.post(
        f"{gateway_url}/v1/audits",
        json={"endpoint": "vllm", "workload": [item], "requests": 2},
        headers=OPS,
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert result["records"] == []  # not asked for
    assert result["summary"]["requests"] == 6
    assert result["summary"]["measured_evidence"]["verdict"] != "yes"
    record = _record(httpx.get(f"{gateway_url}/v1/endpoints", headers=OPS).json(), "vllm")
    assert "measured" in {e["kind"] for e in record["evidence"]}  # type: ignore[union-attr]
    assert record["enabled"] != "yes"


def test_an_audit_answered_by_a_fallback_endpoint_is_not_charged_to_the_audited_one(
    gateway_url: str,
) -> None:
    item = {
        "id": "c",
        "category": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
    }
    resp = httpx.post(
        f"{gateway_url}/v1/audits",
        json={"endpoint": "dead", "workload": [item], "include_records": True},
        headers=OPS,
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert result["summary"]["errors"] == {"served_by_fallback": 2}
    assert {r["served_by"] for r in result["records"]} == {"openai"}
    assert result["summary"]["measured_evidence"]["verdict"] == "unknown"
