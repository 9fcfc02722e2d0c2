"""Measured cost of one ``Transformer.step`` by the number of rows it carries."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from local_verifier.devices import on_own_thread
from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep, Transformer
from local_verifier.step_logits import LOGIT_ROWS, ChunkedLogits

if TYPE_CHECKING:
    from local_verifier.loader import LoadedModel

CONTEXT_TOKENS = 128  # a typical committed prefix per sequence
REPEATS = 3  # timings per row count, round robin, unless MIN_SECONDS are reached first
# a row count whose timings add up to this needs no more: its steps are long beside the
# timer's and the machine's jitter (a 1B model's steps from 64 rows, 0.3-0.9 s, agreed
# with their median of 3 within 3%; SmolLM2's steps, all under 0.12 s, keep 3 timings)
MIN_SECONDS = 0.25
# row counts timed; the others are interpolated linearly. The cost never falls as rows
# grow: a smaller median at more rows is noise and is raised.
GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)

_measured: dict[tuple[int, int], list[float]] = {}


def measure_row_costs(
    lm: LoadedModel, max_rows: int, storage: KVStorage | None = None
) -> list[float]:
    """Seconds of one step over R rows, for R = 0..max_rows (index 0 repeats R = 1).

    Rows are spread over sequences of up to 8 rows each (decode rows with short drafts),
    every sequence attending to ``CONTEXT_TOKENS`` committed slots, on a thread of their own
    (``devices.on_own_thread``). The steps write their K/V into ``storage``'s first slots
    where it has enough (an engine's pool before it serves: nothing in it is read before
    it is written again), else into a storage of their own. Cached per process.
    """
    key = (id(lm.model), max_rows)
    if key not in _measured:
        _measured[key] = on_own_thread(lambda: _measure(lm, max_rows, storage))
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


def _measure(
    lm: LoadedModel,
    max_rows: int,
    storage: KVStorage | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    model = lm.model
    cfg = lm.config
    if storage is None or storage.n_slots < CONTEXT_TOKENS + max_rows:
        storage = KVStorage(
            cfg, CONTEXT_TOKENS + max_rows, device=model.device, dtype=model.kv_dtype
        )
    gen = torch.Generator().manual_seed(0)
    grid = sorted({r for r in GRID if r <= max_rows} | {max_rows})
    steps = {r: _steps(r, cfg.vocab_size, gen) for r in grid}
    # one step at the most rows first allocates the step's buffers; the rest need no warm-up
    # pass: the median of three round-robin runs of a short step drops a slow first one (a
    # pass over every shape cost a quarter of start-up and moved no median beyond the
    # noise: RESULTS.md), and a long step's first run is within the noise of its median
    _run(model, steps[grid[-1]], storage)
    runs: dict[int, list[float]] = {r: [] for r in grid}
    for _ in range(REPEATS):  # round robin, so that load changes hit every size alike
        for r in grid:
            if sum(runs[r]) >= MIN_SECONDS:
                continue
            _sync(model.device)
            begin = clock()
            _run(model, steps[r], storage)
            _sync(model.device)
            runs[r].append(clock() - begin)
    timed = np.maximum.accumulate([statistics.median(runs[r]) for r in grid])
    costs = np.interp(np.arange(max_rows + 1), grid, timed)
    costs[0] = costs[1]
    return [float(c) for c in costs]


def _run(model: Transformer, seqs: list[SeqStep], storage: KVStorage) -> None:
    """One step as the engine runs it: every row's logits, ``LOGIT_ROWS`` at a time."""
    logits = model.step_chunked(seqs, storage, LOGIT_ROWS)
    if isinstance(logits, ChunkedLogits):
        logits.read_all()


class LiveCosts:
    """Step costs by row count: the start-up measurement, kept up to date by the steps run.

    Each step's forward time moves a running ratio, measured over start-up cost, at the
    ``GRID`` points around its row count (by their interpolation weights). The table is the
    start-up cost times that ratio, interpolated between the points steps have reached and
    flat beyond them, never falling as rows grow. A start-up measured under another load,
    at another context length or over other sequence counts than the traffic's thus
    converges to what steps cost now. A point's ratio is the mean of its first steps, then
    a running average giving each new step the weight ``decay``.
    """

    def __init__(self, startup: Sequence[float], decay: float = 0.05) -> None:
        self.startup = np.asarray(startup, dtype=np.float64)
        if self.startup.ndim != 1 or len(self.startup) < 2 or not np.all(self.startup > 0):
            raise ValueError("start-up costs must be positive seconds for 0..max_rows rows")
        max_rows = len(self.startup) - 1
        self.grid = np.asarray(sorted({r for r in GRID if r <= max_rows} | {max_rows}))
        self.decay = decay
        self._log_ratio = np.zeros(len(self.grid))
        self._seen = np.zeros(len(self.grid))  # summed interpolation weights of the steps
        self.table: list[float] = [float(c) for c in self.startup]
        """Seconds of a step of r rows, r = 0..max_rows (index 0 repeats r = 1)."""

    def observe(self, rows: int, seconds: float) -> None:
        """Record that a forward over ``rows`` rows took ``seconds``."""
        if not 1 <= rows < len(self.startup) or not seconds > 0:
            return
        x = math.log(seconds / self.startup[rows])
        hi = int(np.searchsorted(self.grid, rows))
        lo = hi if self.grid[hi] == rows else hi - 1
        span = self.grid[hi] - self.grid[lo]
        frac = 0.0 if span == 0 else (rows - self.grid[lo]) / span
        for point, weight in ((lo, 1.0 - frac), (hi, frac)):
            if weight > 0:
                self._seen[point] += weight
                step = weight / min(self._seen[point], 1.0 / self.decay)
                self._log_ratio[point] += step * (x - self._log_ratio[point])
        reached = self._seen > 0
        ratio = np.exp(
            np.interp(np.arange(len(self.startup)), self.grid[reached], self._log_ratio[reached])
        )
        costs = np.maximum.accumulate(self.startup * ratio)
        costs[0] = costs[1]
        self.table = [float(c) for c in costs]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
