"""Probes against real HTTP servers: vLLM metric text with and without spec-decode
counters, SGLang server info, and an engine that silently ignores ``prediction``."""

from __future__ import annotations

import httpx
import pytest
from engine_standins import VllmStandin, sglang_app

from gateway.audit.serve import serve_in_thread
from gateway.config import EndpointConfig
from gateway.records.probes import (
    llamacpp_timings_evidence,
    probe_engine,
    probe_usage,
    trtllm_metrics_evidence,
    usage_evidence,
)
from gateway.records.service import Records
from gateway.records.store import MemoryRecordStore


async def test_vllm_with_spec_decode_counters_is_yes_and_rising_counters_are_passive_yes() -> None:
    engine = VllmStandin(speculative=True)
    with serve_in_thread(engine.app()) as url:
        async with httpx.AsyncClient() as client:
            first = await probe_engine(client, "vllm", f"{url}/v1", "m", None)
            assert [e.verdict for e in first] == ["yes"]
            assert first[0].values == {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 25}
            assert "acceptance rate 0.62" in first[0].detail
            again = await probe_engine(client, "vllm", f"{url}/v1", "m", first[0])
            assert [e.kind for e in again] == ["probe"]  # nothing rose: no passive evidence
            engine.serve(drafts=2, draft_tokens=8, accepted=6)
            rising = await probe_engine(client, "vllm", f"{url}/v1", "m", first[0])
    assert [(e.kind, e.verdict) for e in rising] == [("probe", "yes"), ("passive", "yes")]
    assert rising[1].values["accepted_tokens_delta"] == 6


async def test_vllm_without_spec_decode_counters_is_no() -> None:
    engine = VllmStandin(speculative=False)
    with serve_in_thread(engine.app()) as url:
        async with httpx.AsyncClient() as client:
            found = await probe_engine(client, "vllm", url, "m", None)
    assert [e.verdict for e in found] == ["no"]


@pytest.mark.parametrize("kind", ["openai_compatible", "vllm"])
async def test_an_engine_that_ignores_prediction_never_comes_out_yes(kind: str) -> None:
    engine = VllmStandin(speculative=False)
    with serve_in_thread(engine.app()) as url:
        async with httpx.AsyncClient() as client:
            usage = await probe_usage(client, f"{url}/v1/chat/completions", "m", {})
        assert usage.verdict == "unknown"
        assert "no evidence" in usage.detail
        assert engine.openai.bodies()[-1]["prediction"]["content"]  # it was sent, and answered 200
        endpoint = EndpointConfig(name="e", kind=kind, base_url=f"{url}/v1", models=["m"])
        records = Records([endpoint], MemoryRecordStore())
        await records.probe(url, {})
        record = await records.record("e")
    assert record.enabled == ("no" if kind == "vllm" else "unknown")
    assert record.evidence


async def test_unreachable_engine_is_unknown() -> None:
    async with httpx.AsyncClient(timeout=2) as client:
        found = await probe_engine(client, "vllm", "http://127.0.0.1:1/v1", "m", None)
    assert [e.verdict for e in found] == ["unknown"]


@pytest.mark.parametrize(("algorithm", "expected"), [("EAGLE3", "yes"), (None, "no")])
async def test_sglang_server_info(algorithm: str | None, expected: str) -> None:
    with serve_in_thread(sglang_app(algorithm)) as url:
        async with httpx.AsyncClient() as client:
            found = await probe_engine(client, "sglang", f"{url}/v1", "m", None)
    assert [e.verdict for e in found] == [expected]


def test_trtllm_and_llamacpp_shapes() -> None:
    stats = [
        {
            "iter": 1,
            "specDecodingStats": {
                "numDraftTokens": 8,
                "numAcceptedTokens": 5,
                "acceptanceLength": 2.2,
            },
        }
    ]
    assert trtllm_metrics_evidence(stats).verdict == "yes"
    assert trtllm_metrics_evidence([{"iter": 1, "numActiveRequests": 1}]).verdict == "no"
    assert trtllm_metrics_evidence([]).verdict == "unknown"
    with_draft = {"timings": {"predicted_n": 20, "draft_n": 12, "draft_n_accepted": 9}}
    assert llamacpp_timings_evidence(with_draft).values["draft_n_accepted"] == 9
    assert llamacpp_timings_evidence({"timings": {"predicted_n": 20}}).verdict == "no"
    assert llamacpp_timings_evidence({}).verdict == "unknown"


def test_usage_fields_decide_only_with_accepted_tokens() -> None:
    def answer(details: dict[str, int] | None) -> dict[str, object]:
        return {"usage": {"completion_tokens": 9, "completion_tokens_details": details}}

    assert (
        usage_evidence(
            answer({"accepted_prediction_tokens": 7, "rejected_prediction_tokens": 2})
        ).verdict
        == "yes"
    )
    assert (
        usage_evidence(
            answer({"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 9})
        ).verdict
        == "unknown"
    )
    assert usage_evidence(answer(None)).verdict == "unknown"
