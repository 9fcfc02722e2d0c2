"""Active probes: ask an endpoint for proof that speculation runs, per engine kind.

Each probe returns one :class:`Evidence`. A plain 200 answer is never evidence: a probe
says ``yes`` only on counters, server settings or usage fields that speculation produces.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.records.evidence import make
from gateway.records.prefix_cache import sglang_prefix_cache_evidence, vllm_prefix_cache_evidence
from sdk.wire.evidence import Evidence

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs."
PROBE_BODY: dict[str, Any] = {
    "messages": [
        {
            "role": "user",
            "content": f"Repeat this text exactly, with nothing else:\n{PROBE_TEXT}",
        }
    ],
    "prediction": {"type": "content", "content": PROBE_TEXT},
    "temperature": 0,
    "max_tokens": 48,
    "stream": False,
}
VLLM_SPEC_PREFIX = "vllm:spec_decode"
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def server_root(base_url: str) -> str:
    """``http://h:8000/v1`` -> ``http://h:8000`` (engine metrics live at the server root)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def _unreachable(source: str, exc: Exception) -> Evidence:
    return make("probe", source, "unknown", f"probe failed: {type(exc).__name__}")


def vllm_metrics_evidence(text: str, previous: Evidence | None = None) -> list[Evidence]:
    """Evidence from vLLM ``/metrics`` text: spec-decode counters exist only when speculation
    is configured; counters that rose since the previous probe show it running on traffic."""
    values: dict[str, float] = {}
    present = False
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(VLLM_SPEC_PREFIX):
            continue
        present = True
        short = VLLM_COUNTERS.get(family.name)
        if short is None:
            continue
        values[short] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    if not present:
        return [
            make(
                "probe",
                "vllm /metrics",
                "no",
                "no vllm:spec_decode_* counters: speculation is not configured",
            )
        ]
    detail = "vllm:spec_decode_* counters present: --speculative-config is set"
    if values.get("draft_tokens"):
        detail += (
            f"; acceptance rate {values.get('accepted_tokens', 0) / values['draft_tokens']:.2f}"
        )
    found = [make("probe", "vllm /metrics", "yes", detail, values)]
    if previous is not None and previous.values and values:
        rose = values.get("accepted_tokens", 0) - previous.values.get("accepted_tokens", 0)
        if rose > 0:
            found.append(
                make(
                    "passive",
                    "vllm /metrics counters",
                    "yes",
                    f"accepted draft tokens rose by {rose:.0f} since the previous probe",
                    {"accepted_tokens_delta": rose},
                )
            )
    return found


def sglang_server_info_evidence(info: Mapping[str, Any]) -> Evidence:
    """Evidence from SGLang ``/server_info``: ``speculative_algorithm`` is null when off."""
    if "speculative_algorithm" not in info:
        return make("probe", "sglang /server_info", "unknown", "no speculative_algorithm field")
    algo = info["speculative_algorithm"]
    if algo in (None, "", "None", "NONE"):
        return make("probe", "sglang /server_info", "no", "speculative_algorithm is null")
    return make("probe", "sglang /server_info", "yes", f"speculative_algorithm = {algo}")


def trtllm_metrics_evidence(stats: Any) -> Evidence:
    """Evidence from ``trtllm-serve`` ``/metrics`` (a JSON list of iteration stats)."""
    items = stats if isinstance(stats, list) else [stats]
    spec = [
        s["specDecodingStats"] for s in items if isinstance(s, dict) and s.get("specDecodingStats")
    ]
    if spec:
        values = {
            k: float(sum(s.get(k, 0) or 0 for s in spec))
            for k in ("numDraftTokens", "numAcceptedTokens")
        }
        return make(
            "probe", "trtllm /metrics", "yes", "iteration stats carry specDecodingStats", values
        )
    if items and all(isinstance(s, dict) for s in items):
        return make("probe", "trtllm /metrics", "no", "iteration stats without specDecodingStats")
    return make("probe", "trtllm /metrics", "unknown", "no iteration stats yet (no traffic)")


def llamacpp_timings_evidence(answer: Mapping[str, Any]) -> Evidence:
    """Evidence from a llama-server answer's ``timings`` (``draft_n`` only when drafting ran)."""
    timings = answer.get("timings")
    if not isinstance(timings, dict):
        return make("probe", "llama.cpp timings", "unknown", "answer has no timings object")
    drafted = timings.get("draft_n")
    if drafted:
        accepted = float(timings.get("draft_n_accepted") or 0)
        return make(
            "probe",
            "llama.cpp timings",
            "yes",
            f"timings.draft_n = {drafted}, draft_n_accepted = {accepted:.0f}",
            {"draft_n": float(drafted), "draft_n_accepted": accepted},
        )
    return make("probe", "llama.cpp timings", "no", "timings without draft_n: no drafting ran")


def usage_evidence(answer: Mapping[str, Any]) -> Evidence:
    """Evidence from a chat answer's usage: only accepted prediction tokens prove drafting."""
    usage = answer.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    accepted = details.get("accepted_prediction_tokens")
    rejected = details.get("rejected_prediction_tokens")
    if accepted is None and rejected is None:
        return make(
            "probe",
            "usage fields",
            "unknown",
            "answered without accepted/rejected_prediction_tokens: no evidence the prediction was used",
        )
    values = {
        "accepted_prediction_tokens": float(accepted or 0),
        "rejected_prediction_tokens": float(rejected or 0),
    }
    if accepted:
        return make(
            "probe",
            "usage fields",
            "yes",
            f"{accepted} accepted prediction tokens reported",
            values,
        )
    return make(
        "probe", "usage fields", "unknown", "prediction read but no tokens accepted", values
    )


async def probe_usage(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    headers: Mapping[str, str],
    endpoint: str | None = None,
) -> Evidence:
    """Send the probe request (with a prediction) and judge the usage fields. Through the
    gateway, an answer another endpoint gave (fallback) says nothing about ``endpoint``."""
    try:
        resp = await client.post(url, json={**PROBE_BODY, "model": model}, headers=dict(headers))
        resp.raise_for_status()
        served_by = resp.headers.get("x-draftgate-endpoint")
        if endpoint is not None and served_by is not None and served_by != endpoint:
            return make(
                "probe", "usage fields", "unknown", f"answered by endpoint {served_by!r} (fallback)"
            )
        return usage_evidence(resp.json())
    except (httpx.HTTPError, ValueError) as exc:
        return _unreachable("usage fields", exc)


async def probe_engine(
    client: httpx.AsyncClient, kind: str, base_url: str, model: str, previous: Evidence | None
) -> list[Evidence]:
    """The engine-specific probe for self-hosted kinds (``vllm``, ``sglang``, ``trtllm``,
    ``llamacpp``), with prefix-cache evidence where vLLM or SGLang shows it; an empty list
    for other kinds. ``previous``: the last speculation probe's evidence with values."""
    root = server_root(base_url)
    try:
        if kind == "vllm":
            resp = await client.get(f"{root}/metrics")
            resp.raise_for_status()
            prefix = vllm_prefix_cache_evidence(resp.text)
            return vllm_metrics_evidence(resp.text, previous) + ([prefix] if prefix else [])
        if kind == "sglang":
            resp = await client.get(f"{root}/server_info")
            if resp.status_code == 404:
                resp = await client.get(f"{root}/get_server_info")
            resp.raise_for_status()
            info = resp.json()
            metrics = await client.get(f"{root}/metrics")  # only with --enable-metrics
            text = metrics.text if metrics.status_code == 200 else None
            prefix = sglang_prefix_cache_evidence(text, info)
            return [sglang_server_info_evidence(info)] + ([prefix] if prefix else [])
        if kind == "trtllm":
            resp = await client.get(f"{root}/metrics")
            resp.raise_for_status()
            return [trtllm_metrics_evidence(resp.json())]
        if kind == "llamacpp":
            body = {**PROBE_BODY, "model": model}
            body.pop("prediction")
            resp = await client.post(f"{base_url.rstrip('/')}/chat/completions", json=body)
            resp.raise_for_status()
            return [llamacpp_timings_evidence(resp.json())]
    except (httpx.HTTPError, ValueError, json.JSONDecodeError) as exc:
        return [_unreachable(f"{kind} probe", exc)]
    return []
