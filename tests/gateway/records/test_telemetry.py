"""Telemetry: histograms inline, roll-ups through a bounded queue, never raising."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.records.store import MemoryRecordStore, RedisRecordStore
from gateway.records.traffic import latency
from gateway.telemetry import RequestTiming, Telemetry


def _timing(ttft: float = 0.1, tokens: int = 11, accepted: int | None = None) -> RequestTiming:
    t = RequestTiming(endpoint="e", model="m", stream=True, t_start=100.0)
    t.t_first_byte = 100.05
    t.t_first_content = 100.0 + ttft
    t.chunk_times = [100.0 + ttft + 0.02 * i for i in range(tokens)]
    t.chunk_tokens = [1] * tokens
    t.t_end = t.chunk_times[-1]
    t.output_tokens = tokens
    t.accepted_prediction_tokens = accepted
    t.rejected_prediction_tokens = 0 if accepted is not None else None
    return t


def _sample(tel: Telemetry, name: str, endpoint: str | None = "e") -> float:
    for family in text_string_to_metric_families(tel.metrics_text().decode()):
        for s in family.samples:
            if s.name == name and s.labels.get("endpoint") == endpoint:
                return s.value
    raise AssertionError(f"{name} not exported")


def test_timing_derives_ttft_tpot_e2e() -> None:
    t = _timing(ttft=0.1, tokens=11)
    assert abs((t.ttft() or 0) - 0.1) < 1e-9
    assert abs((t.tpot() or 0) - 0.02) < 1e-9  # (e2e - TTFT) / (tokens - 1)
    t.output_tokens = None
    assert t.tokens() == (11, True)


async def test_record_updates_histograms_and_rolls_up_to_the_store() -> None:
    tel = Telemetry(MemoryRecordStore())
    for ttft in (0.1, 0.2, 0.3, 0.4):
        assert tel.record(_timing(ttft=ttft)) is None
    assert _sample(tel, "draftgate_ttft_seconds_count") == 4
    assert _sample(tel, "draftgate_output_tokens_sum") == 44
    await tel.flush()
    assert _sample(tel, "draftgate_itl_seconds_count") == 40
    summary = await latency(tel.store, "e")
    assert summary.requests == 4
    assert abs((summary.ttft_p50 or 0) - 0.2) < 1e-9
    assert abs((summary.ttft_p95 or 0) - 0.4) < 1e-9
    assert abs((summary.tpot_p50 or 0) - 0.02) < 1e-9
    await tel.aclose()


async def test_accepted_prediction_tokens_in_traffic_become_passive_evidence() -> None:
    tel = Telemetry()
    tel.record(_timing(accepted=0))
    await tel.flush()
    assert await tel.store.evidence("e") == []
    tel.record(_timing(accepted=7))
    await tel.aclose()  # the drain task is stopped and the queue flushed
    [evidence] = await tel.store.evidence("e")
    assert (evidence.kind, evidence.verdict) == ("passive", "yes")
    assert _sample(tel, "draftgate_accepted_prediction_tokens_total") == 7
    assert (await latency(tel.store, "e")).accepted_prediction_tokens == 7


def test_a_full_queue_drops_and_counts() -> None:
    tel = Telemetry(max_queue=2)
    for _ in range(5):
        tel.record(_timing())
    assert _sample(tel, "draftgate_telemetry_dropped_total", endpoint=None) == 3
    assert _sample(tel, "draftgate_ttft_seconds_count") == 5  # histograms still complete


async def test_a_dead_store_loses_roll_ups_but_never_raises() -> None:
    tel = Telemetry(RedisRecordStore("redis://127.0.0.1:1/0", timeout_s=0.2))
    tel.record(_timing())
    await tel.flush()
    assert _sample(tel, "draftgate_telemetry_store_errors_total", endpoint=None) == 1


def test_a_malformed_timing_never_raises() -> None:
    tel = Telemetry()
    broken = RequestTiming(endpoint="e", model="m", stream=True, t_start=None)  # type: ignore[arg-type]
    broken.t_first_content = 1.0
    assert tel.record(broken) is None


def test_labelled_series_appear_on_first_use_and_count_apart() -> None:
    tel = Telemetry()
    other = _timing()
    other.model, other.status = "other", 502
    for t in (_timing(), _timing(), other):
        tel.record(t)
    requests = {}
    accepted = []
    for family in text_string_to_metric_families(tel.metrics_text().decode()):
        for s in family.samples:
            if s.name == "draftgate_requests_total":
                requests[(s.labels["model"], s.labels["status"])] = s.value
            if s.name.startswith("draftgate_accepted_prediction_tokens"):
                accepted.append(s)
    assert requests == {("m", "200"): 2.0, ("other", "502"): 1.0}
    assert accepted == []  # never used: no zero-valued series
