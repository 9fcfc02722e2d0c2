"""A step's logits read a chunk of rows at a time (``Transformer.step_chunked``) are the
whole step's, bit for bit, on the fused C++ stack and op by op; a chunk's logits are
freed once another chunk is read (the GGUF block types: ``test_quant_native``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
import torch
from arrivals import together
from test_batching import PROMPTS, Collector, ids_of, make_engine

import local_verifier.step as step_module
from local_verifier.config import ModelConfig
from local_verifier.engine import GenerationRequest
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.model import SeqStep, Transformer
from local_verifier.step_logits import ChunkedLogits
from tests.local_verifier.test_fused_step import MODEL_IDS, MODELS

ROWS = (3, 1, 20, 8, 2, 5)  # rows per sequence: one longer than a chunk
CONTEXT = 16


def chunk_steps(vocab: int, rows: Sequence[int] = ROWS, logits: str = "all") -> list[SeqStep]:
    """Sequences of ``rows`` rows each after a ``CONTEXT``-slot context, distinct slots."""
    gen = torch.Generator().manual_seed(3)
    seqs, slot = [], CONTEXT
    for t in rows:
        seqs.append(
            SeqStep(
                tokens=torch.randint(0, vocab, (t,), generator=gen),
                positions=torch.arange(CONTEXT, CONTEXT + t),
                new_slots=torch.arange(slot, slot + t),
                context_slots=torch.arange(CONTEXT),
                logits=logits,
            )
        )
        slot += t
    return seqs


def assert_chunks_are_the_step(model: Transformer, kv: KVStorage, seqs: list[SeqStep]) -> None:
    """For chunks of 1 to 64 rows: the same logits as one step, read in order and again."""
    whole = model.step(seqs, kv)
    picked = sum(w.shape[0] for w in whole)
    for max_rows in (1, 4, 16, 64):
        chunked = model.step_chunked(seqs, kv, max_rows)
        assert isinstance(chunked, ChunkedLogits) == (picked > max_rows)
        assert len(chunked) == len(whole)
        assert all(torch.equal(a, b) for a, b in zip(chunked, whole, strict=True))
        assert torch.equal(chunked[0], whole[0])  # a chunk read again: computed again


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-op"])
@pytest.mark.parametrize(("cfg", "dtype"), MODELS[:2], ids=MODEL_IDS[:2])
def test_chunked_logits_are_the_steps_bits(
    cfg: ModelConfig, dtype: torch.dtype, fused: bool
) -> None:
    model = Transformer.from_config(cfg, "cpu", dtype)
    model.kernel_options = replace(model.kernel_options, backend="cpp", fused=fused)
    kv = KVStorage(model.config, 64, "cpu", model.kv_dtype)
    assert_chunks_are_the_step(model, kv, chunk_steps(model.config.vocab_size))
    assert (model.fused_stack() is not None) == fused
    # only the last row of each: fewer picked rows than chunk rows, no chunking below them
    assert_chunks_are_the_step(model, kv, chunk_steps(model.config.vocab_size, logits="last"))


def test_a_chunks_logits_are_freed_when_the_next_is_read() -> None:
    cfg, dtype = MODELS[0]
    model = Transformer.from_config(cfg, "cpu", dtype)
    kv = KVStorage(model.config, 64, "cpu", model.kv_dtype)
    chunked = model.step_chunked(chunk_steps(model.config.vocab_size), kv, 4)
    first = weakref.ref(chunked[0])  # sequences 0 and 1: 4 rows
    assert first() is not None  # held while its chunk is the one read
    chunked[2]  # the 20-row sequence, a chunk of its own
    gc.collect()
    assert first() is None


class ChunkCounter:
    """A head's wrapper that records, at each call, how many earlier chunks' memory is alive
    (each chunk's logits in a numpy array, which any view of them keeps)."""

    def __init__(self) -> None:
        self.made: list[weakref.ref[np.ndarray]] = []
        self.alive: list[int] = []

    def counted(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (the head's output) moved into memory this counter watches."""
        memory = np.empty(tuple(logits.shape), dtype=np.float32)
        self.made.append(weakref.ref(memory))
        return torch.from_numpy(memory).copy_(logits)

    def count(self) -> None:
        """Record the earlier chunks alive now (called as the head runs)."""
        gc.collect()
        self.alive.append(sum(ref() is not None for ref in self.made))


def _counting_chunks(model: Transformer, max_rows: int) -> tuple[ChunkedLogits, list[int]]:
    """A chunked step whose head records, at each call, how many earlier chunks are alive."""
    kv = KVStorage(model.config, 64, "cpu", model.kv_dtype)
    chunked = model.step_chunked(chunk_steps(model.config.vocab_size), kv, max_rows)
    assert isinstance(chunked, ChunkedLogits)
    counter, head = ChunkCounter(), chunked._head

    def counting(rows: torch.Tensor) -> torch.Tensor:
        counter.count()
        return counter.counted(head(rows))

    chunked._head = counting
    return chunked, counter.alive


def test_read_all_computes_each_chunk_once_holding_one_at_a_time() -> None:
    cfg, dtype = MODELS[0]
    model = Transformer.from_config(cfg, "cpu", dtype)
    chunked, alive = _counting_chunks(model, 4)
    chunked.read_all()
    assert alive == [0] * 5  # (3, 1), (20), (8), (2), (5): none left when the next runs
    assert chunked[5].shape[0] == 5  # read after: its chunk computed again
    assert alive == [0] * 6


def test_a_reader_that_lets_go_of_a_chunk_has_it_freed_before_the_next_is_computed() -> None:
    """Reading sequence by sequence, each tensor dropped before the next read (as the engine's
    step does), the previous chunk is gone when the head runs again; a reader that keeps one
    tensor keeps its chunk."""
    cfg, dtype = MODELS[0]
    model = Transformer.from_config(cfg, "cpu", dtype)
    chunked, alive = _counting_chunks(model, 4)
    for i in range(len(chunked)):
        out = chunked[i]
        assert out.shape[0] == ROWS[i]
        del out
    assert alive == [0] * 5
    chunked, alive = _counting_chunks(model, 4)
    kept = chunked[0]
    for i in range(1, len(chunked)):
        chunked[i]
    assert alive == [0, 1, 1, 1, 1] and kept.shape[0] == ROWS[0]


def test_the_engines_steps_free_each_chunk_of_logits_before_computing_the_next(
    tiny_lm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps of several requests with logits 2 rows at a time: when the head runs, no chunk
    computed before it is still held (the step lets each sequence's logits go once it has
    read them)."""
    monkeypatch.setattr(step_module, "LOGIT_ROWS", 2)
    counter, head = ChunkCounter(), tiny_lm.model._head

    def counting(ops: object, rows: torch.Tensor) -> torch.Tensor:
        counter.count()
        return counter.counted(head(ops, rows))

    monkeypatch.setattr(tiny_lm.model, "_head", counting)
    engine = make_engine(tiny_lm)
    try:
        answers = [Collector() for _ in PROMPTS]
        with together(engine):
            for prompt, answer in zip(PROMPTS, answers, strict=True):
                engine.submit(
                    GenerationRequest(prompt_ids=ids_of(tiny_lm, prompt), max_tokens=8), answer
                )
        assert engine.wait_idle(60)
    finally:
        engine.close()
    assert all(len(a.ids) == 8 for a in answers)
    assert len(counter.alive) > 8 and set(counter.alive) == {0}  # steps of several chunks each
