"""Measured cost of one verify forward with k draft tokens, on this device."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from local_verifier.kv_cache import KVCache

if TYPE_CHECKING:
    from local_verifier.loader import LoadedModel

PREFIX_TOKENS = 128  # a typical committed prefix for the timed forwards
REPEATS = 3
# k values timed; the others are interpolated linearly (c(k) is smooth between these).
# c(k) never falls as k grows: a smaller median at a larger k is noise and is raised.
GRID = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)

_measured: dict[tuple[int, int], list[float]] = {}


def measure_step_costs(lm: LoadedModel, max_k: int) -> list[float]:
    """Seconds of one forward over ``1 + k`` new tokens, for k = 0..max_k (median of runs).

    k = 0 is a plain decode step. Cached per process and model.
    """
    key = (id(lm.model), max_k)
    if key not in _measured:
        _measured[key] = _measure(lm, max_k)
    return list(_measured[key])


def _measure(lm: LoadedModel, max_k: int) -> list[float]:
    model = lm.model
    cfg = lm.config
    prefix = min(PREFIX_TOKENS, max(cfg.max_seq_len - max_k - 1, 0))
    cache = KVCache(cfg, prefix + max_k + 1, device=model.device, dtype=model.dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (prefix + max_k + 1,), generator=gen)
    tokens = tokens.to(model.device)
    if prefix:
        model(tokens[:prefix], cache, last_only=True)
    grid = sorted({k for k in GRID if k <= max_k} | {max_k})
    for k in grid:  # warm up every shape once
        model(tokens[prefix : prefix + k + 1], cache)
        cache.truncate(prefix)
    runs: dict[int, list[float]] = {k: [] for k in grid}
    for _ in range(REPEATS):  # round robin, so that load changes hit every k alike
        for k in grid:
            _sync(model.device)
            begin = time.perf_counter()
            model(tokens[prefix : prefix + k + 1], cache)
            _sync(model.device)
            runs[k].append(time.perf_counter() - begin)
            cache.truncate(prefix)
    timed = np.maximum.accumulate([statistics.median(runs[k]) for k in grid])
    return [float(c) for c in np.interp(np.arange(max_k + 1), grid, timed)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
