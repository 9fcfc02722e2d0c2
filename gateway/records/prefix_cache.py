"""Whether an engine reuses computed prefixes, from what its ``/metrics`` shows.

vLLM: the ``vllm:cache_config_info`` gauge's ``enable_prefix_caching`` label says whether
it is on; the counters ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``
(tokens; before them ``vllm:gpu_prefix_cache_*_total``) give the hit rate, and V0's gauge
``vllm:gpu_prefix_cache_hit_rate`` the rate alone. SGLang: ``/server_info``'s
``disable_radix_cache`` says whether it is on, the gauge ``sglang:cache_hit_rate`` the
rate. Hits prove it is on; zero hits prove nothing (no shared traffic yet). An engine that
shows none of them gives no evidence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.records.evidence import make
from sdk.wire.evidence import Evidence, Verdict

# counter family names as the parser gives them (without ``_total``), newest first
VLLM_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
VLLM_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
VLLM_V0_RATE = "vllm:gpu_prefix_cache_hit_rate"
VLLM_CONFIG = "vllm:cache_config_info"
SGLANG_RATE = "sglang:cache_hit_rate"


def _families(text: str) -> dict[str, list[Any]]:
    """Samples per metric family of Prometheus text."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _counter(families: dict[str, list[Any]], names: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of ``names`` present, summed over its ``_total`` samples (all engines)."""
    for name in names:
        samples = families.get(name)
        if samples is not None:
            return f"{name}_total", sum(s.value for s in samples if s.name.endswith("_total"))
    return None


def _evidence(source: str, on: bool | None, why: str, values: dict[str, float]) -> Evidence:
    rate = values.get("hit_rate")
    if on is None and rate is not None and rate > 0:
        on, why = True, f"{why}: hits, so it is on"
    verdict: Verdict = "unknown" if on is None else ("yes" if on else "no")
    return make("probe", source, verdict, why, values, feature="prefix_cache")


def vllm_prefix_cache_evidence(text: str) -> Evidence | None:
    """Prefix-cache evidence from vLLM ``/metrics`` text (None: it shows none of it)."""
    families = _families(text)
    values: dict[str, float] = {}
    parts: list[str] = []
    on: bool | None = None
    for sample in families.get(VLLM_CONFIG, []):
        flag = sample.labels.get("enable_prefix_caching")
        if flag is not None:
            on = flag.lower() == "true"
            parts.append(f'{VLLM_CONFIG}{{enable_prefix_caching="{flag}"}}')
    queries, hits = _counter(families, VLLM_QUERIES), _counter(families, VLLM_HITS)
    if queries is not None and hits is not None:
        values = {"queries": queries[1], "hits": hits[1]}
        if queries[1] > 0:
            values["hit_rate"] = hits[1] / queries[1]
        parts.append(f"{hits[0]} = {hits[1]:.0f} of {queries[0]} = {queries[1]:.0f} tokens")
    elif VLLM_V0_RATE in families:
        rates = [s.value for s in families[VLLM_V0_RATE]]
        values = {"hit_rate": max(rates)} if rates else {}
        parts.append(f"{VLLM_V0_RATE} = {values.get('hit_rate', 0):.3f}")
    if not parts:
        return None
    return _evidence("vllm /metrics", on, "; ".join(parts), values)


def sglang_prefix_cache_evidence(
    text: str | None, info: Mapping[str, Any] | None
) -> Evidence | None:
    """Prefix-cache evidence from SGLang ``/metrics`` text and ``/server_info`` (None: they
    show none of it)."""
    parts: list[str] = []
    values: dict[str, float] = {}
    on: bool | None = None
    if info is not None and "disable_radix_cache" in info:
        on = not info["disable_radix_cache"]
        parts.append(f"/server_info disable_radix_cache = {info['disable_radix_cache']}")
    rates = [s.value for s in _families(text).get(SGLANG_RATE, [])] if text else []
    if rates:
        values["hit_rate"] = max(rates)
        parts.append(f"{SGLANG_RATE} = {values['hit_rate']:.3f}")
    if not parts:
        return None
    return _evidence("sglang /server_info + /metrics", on, "; ".join(parts), values)
