"""Records say whether an upstream engine caches prefixes, from what its /metrics shows
(real Prometheus text from stand-ins over HTTP), without touching the speculation verdict."""

from __future__ import annotations

import time

import httpx
import pytest
from engine_standins import VllmStandin, sglang_app
from starlette.applications import Starlette

from gateway.audit.serve import serve_in_thread
from gateway.config import EndpointConfig
from gateway.records.service import Records
from gateway.records.store import MemoryRecordStore
from sdk.wire.endpoints import EndpointRecord


async def _record(kind: str, app: Starlette) -> EndpointRecord:
    with serve_in_thread(app) as url:
        endpoint = EndpointConfig(name="e", kind=kind, base_url=f"{url}/v1", models=["m"])
        records = Records([endpoint], MemoryRecordStore())
        async with httpx.AsyncClient(base_url=url) as gateway:
            await records.probe(gateway, {})
        return await records.record("e")


async def test_vllm_with_prefix_caching_on_shows_the_hit_counters_as_evidence() -> None:
    engine = VllmStandin(speculative=False, prefix_caching=True)
    engine.queries.inc(1000)
    engine.hits.inc(750)
    began = time.time()
    record = await _record("vllm", engine.app())
    assert record.prefix_cache == "yes"
    ev = record.prefix_cache_evidence
    assert ev is not None and ev.feature == "prefix_cache" and ev.source == "vllm /metrics"
    assert ev.values == {"queries": 1000, "hits": 750, "hit_rate": 0.75}
    assert 'enable_prefix_caching="True"' in ev.detail
    assert "vllm:prefix_cache_hits_total = 750" in ev.detail
    assert ev.observed_at >= began
    assert record.enabled == "no"  # no spec-decode counters: speculation's verdict is its own
    assert record.enabled_evidence is not None
    assert record.enabled_evidence.feature == "speculation"


async def test_vllm_with_prefix_caching_off_is_no() -> None:
    record = await _record("vllm", VllmStandin(speculative=True, prefix_caching=False).app())
    assert record.prefix_cache == "no"
    assert record.enabled == "yes"
    assert record.prefix_cache_evidence is not None
    assert record.prefix_cache_evidence.values == {"queries": 0, "hits": 0}


@pytest.mark.parametrize(("rate", "verdict"), [(0.4, "yes"), (0.0, "unknown")])
async def test_vllm_v0_hit_rate_gauge_proves_it_on_only_with_hits(
    rate: float, verdict: str
) -> None:
    record = await _record("vllm", VllmStandin(speculative=False, v0_hit_rate=rate).app())
    assert record.prefix_cache == verdict
    found = [e for e in record.evidence if e.feature == "prefix_cache"]
    assert len(found) == 1 and found[0].values == {"hit_rate": rate}
    assert "vllm:gpu_prefix_cache_hit_rate" in found[0].detail


async def test_an_engine_that_shows_no_prefix_metrics_gives_no_evidence() -> None:
    record = await _record("vllm", VllmStandin(speculative=True).app())
    assert record.prefix_cache == "unknown" and record.prefix_cache_evidence is None
    assert all(e.feature == "speculation" for e in record.evidence)


@pytest.mark.parametrize(
    ("radix", "rate", "verdict"),
    [(True, 0.3, "yes"), (False, 0.0, "no"), (None, 0.25, "yes"), (None, 0.0, "unknown")],
)
async def test_sglang_server_info_and_cache_hit_rate(
    radix: bool | None, rate: float, verdict: str
) -> None:
    record = await _record("sglang", sglang_app("EAGLE", radix, rate))
    assert record.prefix_cache == verdict
    assert record.enabled == "yes"
    found = [e for e in record.evidence if e.feature == "prefix_cache"]
    assert len(found) == 1 and found[0].values == {"hit_rate": rate}
    assert "sglang:cache_hit_rate" in found[0].detail


async def test_sglang_without_metrics_still_reads_server_info() -> None:
    record = await _record("sglang", sglang_app(None, radix_cache=True))
    assert record.prefix_cache == "yes"
    assert record.enabled == "no"
