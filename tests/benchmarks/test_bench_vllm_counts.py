"""bench_vllm's reading of vLLM's speculation counters (its Prometheus text as vLLM 0.32
writes it) and the steps, draft and accepted tokens per answer it reports from them."""

from __future__ import annotations

from benchmarks.bench_vllm import _spec_summary, spec_counters

METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="smollm2-135m"} 12.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smollm2-135m"} 140.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smollm2-135m"} 97.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 11.0
vllm:spec_decode_num_drafts_created 1.7e+09
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="smollm2-135m"} 3.0
vllm:iteration_tokens_total_count{engine="0",model_name="smollm2-135m"} 14.0
vllm:iteration_tokens_total_sum{engine="0",model_name="smollm2-135m"} 400.0
"""


def test_the_counters_are_read_by_name_and_summed_over_labels() -> None:
    assert spec_counters(METRICS) == {
        "steps": 14,
        "drafts": 12,
        "draft_tokens": 140,
        "accepted_tokens": 97,
    }
    twice = METRICS + METRICS.replace('engine="0"', 'engine="1"')
    assert spec_counters(twice)["accepted_tokens"] == 194
    assert spec_counters("# no speculation\n") == {
        "steps": 0,
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
    }


def test_the_answers_steps_and_tokens_are_summed_and_taken_per_step() -> None:
    answers = [
        {"spec": {"steps": 6, "drafts": 3, "draft_tokens": 40, "accepted_tokens": 30}},
        {"spec": {"steps": 4, "drafts": 2, "draft_tokens": 10, "accepted_tokens": 5}},
    ]
    row = _spec_summary(answers, tokens=45)
    assert row == {
        "steps": 10,
        "draft_tokens": 50,
        "accepted_tokens": 35,
        "drafted_per_step": 5.0,
        "tokens_per_step": 4.5,
    }
