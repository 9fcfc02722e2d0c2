"""Every product benchmark's ``--smoke`` run, as a user runs it (``python -m benchmarks.NAME``
from the repository root, in a process of its own), and the shape of the JSON it writes:
a benchmark that nothing runs breaks unnoticed. Every ``benchmarks/bench_*.py`` is run; the
ones named in ``SHAPES`` have their figures' shape checked too. The ones in ``SLOW`` load
and calibrate the real model in several processes (one to two and a half minutes each on a
2-core AVX2 CPU): they are marked ``slow`` (``pytest -m slow tests/benchmarks``), so the
default run stays within CI's time on such a machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
NEEDS_REDIS = {"bench_abuse", "bench_corpus_abuse", "bench_lookup"}
SLOW = {
    "bench_contention", "bench_decode", "bench_engine", "bench_models", "bench_prefix",
    "bench_remote", "bench_scale", "bench_serving", "bench_speculative",
}  # fmt: skip
LLAMACPP_BUILD = os.environ.get("DRAFTGATE_LLAMACPP_BUILD")
VLLM_ENV = os.environ.get("DRAFTGATE_VLLM_ENV")  # benchmarks.vllm_server install / convert


def smoke(name: str, out: Path, *extra: str) -> dict[str, Any]:
    """``python -m benchmarks.NAME --smoke --json OUT EXTRA...``; the JSON it wrote."""
    command = [sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--json", str(out), *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["machine"]["cpu"] and result["machine"]["cpus"] >= 1
    return result


def _gateway_overhead(result: dict[str, Any]) -> None:
    for key in ("added_ms", "added_ms_stream"):
        assert set(result[key]) == {"c1", "c4"}
        for level in result[key].values():
            assert level["n"] >= 40
            assert level["gateway_req_per_s"] > 0 and level["reported_overhead_p50_ms"] >= 0


def _abuse(result: dict[str, Any]) -> None:
    for condition in ("without_abuser", "with_abuser"):
        assert result[condition]["ttft_ms"]["p99"] > 0
    assert result["honest_documents"]["kept_unchanged"] == result["honest_documents"]["stored"]


def _contention(result: dict[str, Any]) -> None:
    assert set(result["phases"]) == {"quiet", "beside_competitor", "quiet_again"}
    for runs in result["phases"].values():
        assert [r["tokens"] for r in runs] == [8] and runs[0]["tok_s"] > 0
    assert all(count >= 0 for count in result["stalls"].values())


def _lookup(result: dict[str, Any]) -> None:
    assert result["corpus_tokens"] == 20000 and result["build_tokens_per_s"] > 0
    assert result["tree"] and result["redis_round_trips"] >= 1
    assert {row["store"] for row in result["scaling"]} == {"memory", "redis"}


def _corpus_abuse(result: dict[str, Any]) -> None:
    for phase in ("before", "after"):
        for ns in ("honest", "attacked"):
            assert result[phase][ns]["lookup_found_own_document"] == 1.0
    assert set(result["after_over_before"]["attacked"]) == {"upload", "lookup", "crafted_lookup"}


def _speculative(result: dict[str, Any]) -> None:
    assert [p["id"] for p in result["prompts"]] == ["edit00"]
    assert all(p["identical"] for p in result["prompts"])  # lossless: the same tokens
    assert set(result["summary"]["all"]["tps"]) == {"plain", "speculative", "hf_plain", "hf_pld"}


def _decode(result: dict[str, Any]) -> None:
    assert set(result["step_ms"]) == {"1", "4"}
    assert result["prefill"][0]["tokens"] == 256
    assert result["summary"]["prompts_run"] == 1 and result["summary"]["decode_tps"]["hf"] > 0


def _engine(result: dict[str, Any]) -> None:
    (run,) = result["runs"]
    assert all(run["invariance"].values()), run["invariance"]
    assert run["identical"] == {"greedy": 1.0, "seeded": 1.0}
    assert set(run["output_tok_s"]) == {f"c{c}_{d}" for c in (1, 3) for d in ("plain", "drafts")}


def _serving(result: dict[str, Any]) -> None:
    levels = [(r["concurrency"], r["drafts"]) for r in result["levels"]]
    assert levels == [(1, False), (1, True), (2, False), (2, True)]
    assert all(r["identical"] == 1.0 and r["output_tok_s"] > 0 for r in result["levels"])


def _prefix(result: dict[str, Any]) -> None:
    assert result["identical"]["answers"] == result["identical"]["identical"] > 0
    assert result["identical"]["with_hits"] > 0  # the reuse gateway found its prefixes
    assert set(result["memory"]) == {"reuse", "cold"}


def _scale(result: dict[str, Any]) -> None:
    assert result["rounds_done"] == 1
    assert result["throughput"]["two"]["requests_per_s"] > 0
    assert set(result["sessions"]) == {"least-busy", "prefix"}


def _llamacpp(result: dict[str, Any]) -> None:
    assert result["summary"]["prompts"] == 1
    assert set(result["summary"]["tps"]) == {"llama_plain", "llama_lookup", "plain", "speculative"}
    assert result["summary"]["prefill"][0]["length"] == 128


def _vllm(result: dict[str, Any]) -> None:
    assert result["self_test"]["state"] == "exact"
    plain, draftgate = result["methods"]["plain"][0], result["methods"]["draftgate"][0]
    assert plain["server_errors"] == draftgate["server_errors"] == 0
    assert draftgate["identical"] == draftgate["answers"] == 1  # the real vLLM's own answer
    assert draftgate["verified_remotely"] == 1
    engine = result["methods"]["in-engine_k8"][0]  # vLLM's ngram with the gateway's drafts
    assert engine["server_errors"] == 0 and engine["identical"] == engine["answers"] == 1
    assert engine["with_drafts"] == 1 and result["plugin_logged"]["in-engine_k8"]


def _models(result: dict[str, Any]) -> None:
    shape = result["shapes"]["smoke"]
    assert shape["head_is_embedding"] and shape["peak_rss_mib"] > 0 and shape["step_1row_ms"] > 0
    assert {"gguf-bf16", "gguf-q8_0"} <= set(shape)
    if LLAMACPP_BUILD:  # llama-bench beside ours on each GGUF file
        for fmt in ("gguf-bf16", "gguf-q8_0"):
            assert shape[fmt]["llama_cpp"]["decode"]["tok_s"] > 0
            assert shape[fmt]["decode_ours_over_llama"] > 0
            assert len(shape[fmt]["decode_rounds"]) == 2  # --rounds 2: a second decode pair
    else:
        assert result["llama_cpp"].startswith("not run")
    assert result["speculative"]["smollm2-135m"]["identical"] == "1/1"  # lossless


def _fairness(result: dict[str, Any]) -> None:
    (alone,) = result["alone"]
    assert alone["answers"] == 2 and not alone["errors"]
    abuser = result["abusers"]["sampled_resend"]
    (run,) = abuser["runs"]
    assert run["beside_abuser"]["answers"] == 2 and abuser["honest_errors"] == 0
    assert abuser["honest_text_identical"]  # greedy and batch-invariant: the same answers
    assert abuser["e2e_paired_ratio_p50"]["median"] > 0
    assert run["beside_abuser"]["cpu_s"]["load_generator"] > 0
    assert result["engine"]["within_pool"]


def _rejections(result: dict[str, Any]) -> None:
    kinds = result["kinds"]
    assert kinds["wrong_key"]["keep_alive"]["runs"][0]["statuses"] == {"401": 40}
    assert kinds["over_limit"]["new_connection"]["runs"][0]["statuses"] == {"429": 40}
    for kind in kinds.values():
        assert kind["keep_alive"]["server_cpu_us_per_request"] > 0


def _remote(result: dict[str, Any]) -> None:
    assert result["self_test"]["state"] == "exact"
    assert len(result["categories"]) == 2
    for row in result["categories"].values():
        assert row["identical"] == 1.0  # greedy: remotely verified = the engine's own answer
        assert row["remote_tok_s"] > 0 and row["passthrough_tok_s"] > 0


def _agent(result: dict[str, Any]) -> None:
    assert set(result["shapes"]) == {"edit", "patch", "write"}
    for row in result["shapes"].values():
        assert row["identical"]  # lossless: drafts off, from the prompt, from the conversation
        assert 1 <= row["output_tokens"] <= 12 and row["ratio"] > 0
        steps = row["intended_answer"]["steps"]  # the conversation's forms draft the edit
        assert steps["agent"] < steps["prompt"]
    assert result["conversation_sources"]["tokens"] > result["listing_tokens"]


SHAPES: dict[str, Callable[[dict[str, Any]], None]] = {
    "bench_abuse": _abuse,
    "bench_agent": _agent,
    "bench_contention": _contention,
    "bench_corpus_abuse": _corpus_abuse,
    "bench_decode": _decode,
    "bench_engine": _engine,
    "bench_fairness": _fairness,
    "bench_gateway": _gateway_overhead,
    "bench_llamacpp": _llamacpp,
    "bench_models": _models,
    "bench_lookup": _lookup,
    "bench_prefix": _prefix,
    "bench_rejections": _rejections,
    "bench_remote": _remote,
    "bench_scale": _scale,
    "bench_serving": _serving,
    "bench_speculative": _speculative,
    "bench_vllm": _vllm,
}


def _param(name: str) -> Any:
    marks = [pytest.mark.redis] if name in NEEDS_REDIS else []
    if name in SLOW:
        marks.append(pytest.mark.slow)
    if name == "bench_llamacpp":
        marks.append(
            pytest.mark.skipif(
                not LLAMACPP_BUILD,
                reason="llama.cpp is built from source (minutes): set DRAFTGATE_LLAMACPP_BUILD "
                "to a --build-dir of benchmarks.bench_llamacpp",
            )
        )
    if name == "bench_vllm":
        marks += [
            pytest.mark.slow,
            pytest.mark.skipif(
                not VLLM_ENV,
                reason="vLLM's CPU build lives in its own environment: set DRAFTGATE_VLLM_ENV "
                "and DRAFTGATE_VLLM_MODEL (python -m benchmarks.vllm_server install / convert)",
            ),
        ]
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in BENCHMARKS])
def test_smoke(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    extra: list[str] = []
    if name in NEEDS_REDIS:
        extra = ["--redis-url", request.getfixturevalue("redis_url")]
    if name == "bench_llamacpp":
        extra = ["--build-dir", str(LLAMACPP_BUILD)]
    if name == "bench_models" and LLAMACPP_BUILD:
        extra = ["--llamacpp", LLAMACPP_BUILD, "--rounds", "2"]
    result = smoke(name, tmp_path / f"{name}.json", *extra)
    SHAPES.get(name, lambda _: None)(result)
