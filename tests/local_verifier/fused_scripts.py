"""Scripts of steps that the fused C++ stack and the per-op C++ path both run, and the
comparison of their logits and K/V (``torch.equal``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from local_verifier.kernels.cpp import CppOps
from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep, Transformer

Script = list[list[SeqStep]]
PER_OP_KERNELS = ("linear", "rms_norm", "rope_store", "silu_mul", "gelu_tanh_mul", "attention")
CHUNK_START = 300  # the chunked prompt's first slot


def tokens(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def rows(toks: torch.Tensor, first_slot: int, context: int, **kw: Any) -> SeqStep:
    """Rows in slots [first_slot, ...) after the context slots [0, context)."""
    n = len(toks)
    return SeqStep(
        tokens=toks,
        positions=torch.arange(context, context + n),
        new_slots=torch.arange(first_slot, first_slot + n),
        context_slots=torch.arange(context),
        **kw,
    )


def tree(toks: torch.Tensor, first_slot: int, context: int) -> SeqStep:
    """A draft tree: row i's parent is (i - 1) // 2."""
    n = len(toks)
    mask, depth = torch.zeros(n, n, dtype=torch.bool), [0] * n
    for i in range(n):
        mask[i, i] = True
        if i:
            mask[i] |= mask[(i - 1) // 2]
            depth[i] = depth[(i - 1) // 2] + 1
    step = rows(toks, first_slot, context, mask=mask)
    step.positions = torch.tensor([context + d for d in depth])
    return step


def chunk(toks: torch.Tensor, start: int) -> SeqStep:
    """Rows [start, start + len) of a prompt kept in slots CHUNK_START...: the chunk after
    the earlier ones."""
    n = len(toks)
    first = CHUNK_START + start
    return SeqStep(
        tokens=toks,
        positions=torch.arange(start, start + n),
        new_slots=torch.arange(first, first + n),
        context_slots=torch.arange(CHUNK_START, first),
        logits="last",
    )


def script(vocab: int, prompt: int) -> Script:
    """The steps every comparison runs: a prompt, a decode row, a chain, a tree, several
    sequences in one step (logits all, last and none), then a prompt in chunks of 7."""
    chunked = tokens(42, 10, vocab)
    return [
        [rows(tokens(prompt, 1, vocab), 0, 0)],
        [rows(tokens(1, 2, vocab), prompt, prompt)],
        [rows(tokens(5, 3, vocab), prompt + 1, prompt + 1)],
        [tree(tokens(8, 4, vocab), 100, prompt + 1)],
        [
            rows(tokens(13, 5, vocab), 120, 0, logits="last"),
            rows(tokens(1, 6, vocab), 140, 10),
            rows(tokens(3, 7, vocab), 141, 10, logits="none"),
            tree(tokens(8, 8, vocab), 150, prompt + 1),
            rows(tokens(4, 9, vocab), 160, 0),
        ],
        *([chunk(chunked[i : i + 7], i)] for i in range(0, 42, 7)),
    ]


def _not_called(*args: object) -> None:
    raise AssertionError("the fused step called a per-op kernel")


def run(
    model: Transformer,
    steps: Script,
    fused: bool,
    mp: pytest.MonkeyPatch,
    threads: int = 0,
    slots: int = 400,
) -> tuple[list[list[torch.Tensor]], KVStorage]:
    """Each step's logits and the K/V storage (of ``slots``) after the steps, on one path."""
    kv = KVStorage(model.config, slots, "cpu", model.kv_dtype)
    before = torch.get_num_threads()
    model.kernel_options = replace(model.kernel_options, backend="cpp", fused=fused)
    with mp.context() as m:
        if fused:
            for kernel in PER_OP_KERNELS:
                m.setattr(CppOps, kernel, _not_called)
        torch.set_num_threads(threads or before)
        try:
            outs = [model.step(seqs, kv) for seqs in steps]
        finally:
            torch.set_num_threads(before)
        assert (model.fused_stack() is not None) == fused
    return outs, kv


def assert_same_runs(
    a: tuple[list[list[torch.Tensor]], KVStorage], b: tuple[list[list[torch.Tensor]], KVStorage]
) -> None:
    """Two runs of one script: bitwise the same logits at every step and the same K/V."""
    (ours, kv), (theirs, kv_ref) = a, b
    for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True)), f"step {i}"
    assert torch.equal(kv.k, kv_ref.k) and torch.equal(kv.v, kv_ref.v)


def assert_fused_is_per_op(
    model: Transformer, steps: Script, mp: pytest.MonkeyPatch, threads: int = 0, slots: int = 400
) -> None:
    """The fused stack and the per-op path give bitwise the same logits and K/V."""
    assert_same_runs(*(run(model, steps, f, mp, threads, slots) for f in (True, False)))
