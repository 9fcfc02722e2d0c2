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
from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from tests.conftest import WORKLOAD

MAX_TOKENS = 32
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


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


RECORD_IDS = [r["id"] for r in _records(WORKLOAD)]
_plain: dict[str, tuple[list[int], list[int], str]] = {}


def _plain_answer(lm: LoadedModel, record: dict[str, Any]) -> tuple[list[int], list[int], str]:
    """(prompt ids, plain greedy ids, text), computed once per record."""
    if record["id"] not in _plain:
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(record["messages"]))
        limit = min(MAX_TOKENS, record.get("max_tokens") or MAX_TOKENS)
        items = list(generate_plain(lm, ids, SamplingParams(), limit))
        result = items[-1]
        assert isinstance(result, PlainResult)
        text = "".join(i.text for i in items[:-1] if isinstance(i, TextDelta))
        _plain[record["id"]] = (ids, result.token_ids, text)
    return _plain[record["id"]]


@pytest.mark.parametrize("record_id", RECORD_IDS)
def test_workload_speculative_equals_plain(
    engine: Engine, smollm2: LoadedModel, workload_path: Path, record_id: str
) -> None:
    records = _records(workload_path)
    n = [r["id"] for r in records].index(record_id)
    record = records[n]
    ids, want_ids, want_text = _plain_answer(smollm2, record)
    limit = min(MAX_TOKENS, record.get("max_tokens") or MAX_TOKENS)
    docs = [d["text"] for d in record.get("documents") or []]
    if record.get("series"):  # earlier answers of the series are documents
        docs += [
            _plain_answer(smollm2, r)[2] for r in records[:n] if r.get("series") == record["series"]
        ]
    req = GenerationRequest(
        prompt_ids=ids,
        max_tokens=limit,
        prediction=record.get("prediction"),
        documents=[_document(smollm2, d) for d in docs],
    )
    got_ids, got_text, stats = _spec(engine, req)
    assert got_ids == want_ids, "lookup drafts changed the output"
    assert got_text == want_text
    if record.get("prediction"):
        assert stats.accepted_tokens > 0  # the prediction was really used

    mode = INJECTED[n % len(INJECTED)]
    eos = min(smollm2.tokenizer.eos_ids)
    drafter = OracleDrafter(want_ids, smollm2.config.vocab_size, mode, eos, seed=n)
    got_ids, got_text, stats = _spec(
        engine,
        GenerationRequest(prompt_ids=ids, max_tokens=limit),
        drafter=drafter,
        controller=PassThrough(k=6, width=3 if mode == "tree" else 1),
    )
    assert got_ids == want_ids, f"{mode} drafts changed the output"
    assert got_text == want_text
    assert stats.drafted_tokens > 0
