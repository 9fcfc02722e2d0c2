"""Greedy speculative decoding on the real SmolLM2 is token-identical to plain decoding,
for every workload prompt: with the engine's own lookup drafts (prediction, documents,
series answers) and with injected drafts that are right, partly right, random or
adversarial, as chains and as trees."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from spec_drafts import OracleDrafter, PassThrough

from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.generate import PlainResult, generate_plain
from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams

MAX_TOKENS = 48
INJECTED = ["right", "partly", "random", "shifted", "tree", "eos"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(smollm2: LoadedModel) -> Engine:
    return Engine(smollm2)


def _document(lm: LoadedModel, text: str) -> tuple[str, np.ndarray]:
    key = hashlib.sha256(text.encode()).hexdigest()
    return key, np.asarray(lm.tokenizer.encode(text), dtype=np.uint32)


def _spec(
    engine: Engine, req: GenerationRequest, **inject: Any
) -> tuple[list[int], str, GenerationStats]:
    items = list(engine.generate(req, **inject))
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    deltas = [i for i in items[:-1] if isinstance(i, TextDelta)]
    return [t for d in deltas for t in d.token_ids], "".join(d.text for d in deltas), stats


def test_workload_speculative_equals_plain(
    engine: Engine, smollm2: LoadedModel, workload_path: Path
) -> None:
    records = [json.loads(line) for line in workload_path.read_text().splitlines() if line]
    series_answers: dict[str, list[str]] = {}
    accepted_total = 0
    for n, record in enumerate(records):
        text = smollm2.tokenizer.apply_chat_template(record["messages"])
        ids = smollm2.tokenizer.encode(text)
        limit = min(MAX_TOKENS, record.get("max_tokens") or MAX_TOKENS)
        plain_items = list(generate_plain(smollm2, ids, SamplingParams(), limit))
        result = plain_items[-1]
        assert isinstance(result, PlainResult)
        plain_text = "".join(i.text for i in plain_items[:-1] if isinstance(i, TextDelta))

        docs = [d["text"] for d in record.get("documents") or []]
        docs += series_answers.get(record.get("series") or "", [])
        req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=limit,
            prediction=record.get("prediction"),
            documents=[_document(smollm2, d) for d in docs],
        )
        got_ids, got_text, stats = _spec(engine, req)
        assert got_ids == result.token_ids, f"{record['id']}: lookup drafts changed the output"
        assert got_text == plain_text
        accepted_total += stats.accepted_tokens
        if record.get("series"):
            series_answers.setdefault(record["series"], []).append(plain_text)

        mode = INJECTED[n % len(INJECTED)]
        drafter = OracleDrafter(
            result.token_ids,
            smollm2.config.vocab_size,
            mode,
            min(smollm2.tokenizer.eos_ids),
            seed=n,
        )
        width = 3 if mode == "tree" else 1
        got_ids, got_text, stats = _spec(
            engine,
            GenerationRequest(prompt_ids=ids, max_tokens=limit),
            drafter=drafter,
            controller=PassThrough(k=10, width=width),
        )
        assert got_ids == result.token_ids, f"{record['id']}: {mode} drafts changed the output"
        assert got_text == plain_text
        assert stats.drafted_tokens > 0
    assert accepted_total > 0  # the workload's predictions were really used
