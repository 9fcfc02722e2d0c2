"""Measured cost of one ``Transformer.step`` by the number of rows it carries."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep

if TYPE_CHECKING:
    from local_verifier.loader import LoadedModel

CONTEXT_TOKENS = 128  # a typical committed prefix per sequence
REPEATS = 3
# row counts timed; the others are interpolated linearly. The cost never falls as rows
# grow: a smaller median at more rows is noise and is raised.
GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

_measured: dict[tuple[int, int], list[float]] = {}


def measure_row_costs(lm: LoadedModel, max_rows: int) -> list[float]:
    """Seconds of one step over R rows, for R = 0..max_rows (index 0 repeats R = 1).

    Rows are spread over sequences of up to 8 rows each (decode rows with short drafts),
    every sequence attending to ``CONTEXT_TOKENS`` committed slots. Cached per process.
    """
    key = (id(lm.model), max_rows)
    if key not in _measured:
        _measured[key] = _measure(lm, max_rows)
    return list(_measured[key])


def _steps(rows: int, vocab: int, gen: torch.Generator) -> list[SeqStep]:
    seqs = []
    next_slot = CONTEXT_TOKENS
    for first in range(0, rows, 8):
        t = min(8, rows - first)
        seqs.append(
            SeqStep(
                tokens=torch.randint(0, vocab, (t,), generator=gen),
                positions=torch.arange(CONTEXT_TOKENS, CONTEXT_TOKENS + t),
                new_slots=torch.arange(next_slot, next_slot + t),
                context_slots=torch.arange(CONTEXT_TOKENS),
            )
        )
        next_slot += t
    return seqs


def _measure(lm: LoadedModel, max_rows: int) -> list[float]:
    model = lm.model
    cfg = lm.config
    storage = KVStorage(cfg, CONTEXT_TOKENS + max_rows, device=model.device, dtype=model.dtype)
    gen = torch.Generator().manual_seed(0)
    grid = sorted({r for r in GRID if r <= max_rows} | {max_rows})
    steps = {r: _steps(r, cfg.vocab_size, gen) for r in grid}
    for r in grid:  # warm up every shape once
        model.step(steps[r], storage)
    runs: dict[int, list[float]] = {r: [] for r in grid}
    for _ in range(REPEATS):  # round robin, so that load changes hit every size alike
        for r in grid:
            _sync(model.device)
            begin = time.perf_counter()
            model.step(steps[r], storage)
            _sync(model.device)
            runs[r].append(time.perf_counter() - begin)
    timed = np.maximum.accumulate([statistics.median(runs[r]) for r in grid])
    costs = np.interp(np.arange(max_rows + 1), grid, timed)
    costs[0] = costs[1]
    return [float(c) for c in costs]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
