"""KV on demand on the tiny model: a pool too small for every answer at once preempts
(the latest request of the tenant furthest above its weighted share of the pool) and
recomputes, and each resumed answer is the uninterrupted one bit for bit: its tokens, text
and logprobs (floats compared exactly), greedy and seeded, with drafts."""

from __future__ import annotations

import httpx
import pytest
from arrivals import together

from gateway.app import create_app
from gateway.audit.serve import serve_in_thread
from gateway.cli.serve import verifier_settings
from local_verifier.engine import Engine, GenerationRequest
from local_verifier.kv_pool import DEFAULT_BLOCK_SIZE
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.logits_processors import Penalties
from local_verifier.sampling import SamplingParams
from tests.local_verifier.collect import Collector

PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over",
    "x = 1\ny = 2\nz = x + y\n",
    "aaaa bbbb aaaa bbbb",
]
MAX_TOKENS = 90
NO_END = Penalties(logit_bias={0: -100.0, 1: -100.0, 2: -100.0})  # every answer runs long


def make_engine(lm: LoadedModel, kv_cache_mb: float) -> Engine:
    costs = [1e-3 + 1e-5 * r for r in range(32 + 8 + 1)]
    return Engine(lm, max_draft=8, token_budget=32, row_costs=costs, kv_cache_mb=kv_cache_mb)


def requests(params: SamplingParams) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            prompt=p,
            params=params,
            max_tokens=MAX_TOKENS,
            penalties=NO_END,
            logprobs=3,
            owner=f"tenant{i % 2}",
            weight=1.0 + i % 2,
        )
        for i, p in enumerate(PROMPTS)
    ]


@pytest.mark.parametrize(
    "params", [SamplingParams(), SamplingParams(temperature=0.9, top_k=40, seed=11)]
)
def test_preempted_answers_equal_uninterrupted_ones(
    tiny_lm: LoadedModel, params: SamplingParams
) -> None:
    roomy = make_engine(tiny_lm, kv_cache_mb=4)
    alone = []
    for req in requests(params):
        answer = Collector()
        roomy.submit(req, answer)
        assert roomy.wait_idle(60)
        alone.append((answer.ids, answer.text, answer.logprobs))
    roomy.close()
    # 12 blocks: the four answers need about 30 at once
    block = KVStorage.bytes_per_slot(tiny_lm.config, tiny_lm.model.kv_dtype) * DEFAULT_BLOCK_SIZE
    tight = make_engine(tiny_lm, kv_cache_mb=12 * block / 2**20)
    assert tight.pool.n_blocks == 12
    answers = [Collector() for _ in PROMPTS]
    with together(tight):
        for req, answer in zip(requests(params), answers, strict=True):
            tight.submit(req, answer)
    assert tight.wait_idle(120)
    assert tight.stats().preemptions > 0
    # each answer reports its own preemptions (the audits read them from the response)
    stats = [a.items[-2] for a in answers]
    assert sum(s.preemptions for s in stats) == tight.stats().preemptions
    for answer, want in zip(answers, alone, strict=True):
        ids, text, logprobs = answer.ids, answer.text, answer.logprobs
        assert len(ids) == MAX_TOKENS
        assert ids == want[0] and text == want[1]
        assert logprobs == want[2]  # the logits' floats, exactly
    assert tight.pool.used() == 0
    app = create_app(verifier_settings("tiny"), engines={"local": tight})
    with serve_in_thread(app) as url:
        metrics = httpx.get(f"{url}/metrics").text
    line = 'draftgate_local_preemptions_total{endpoint="local"} '
    counted = [float(x.removeprefix(line)) for x in metrics.splitlines() if x.startswith(line)]
    assert counted == [tight.stats().preemptions]
    tight.close()
