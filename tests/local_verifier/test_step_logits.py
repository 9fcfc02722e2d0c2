"""A step's logits read a chunk of rows at a time (``Transformer.step_chunked``) are the
whole step's, bit for bit, on the fused C++ stack and op by op; a chunk's logits are
freed once another chunk is read (the GGUF block types: ``test_quant_native``)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from local_verifier.config import ModelConfig
from local_verifier.kv_storage import KVStorage
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
