"""Device, dtype and CPU thread choices."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str | None) -> torch.device:
    """``device`` as given, else CUDA when available, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """``dtype`` by name, else bf16 on CUDA and fp32 on CPU."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}") from None


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def configure_threads(workload: Callable[[], object], repeats: int = 3) -> int:
    """Set torch's CPU threads to one per available CPU or to 1, whichever runs ``workload``
    faster now (on a busy machine the threads' synchronisation can cost more than they
    gain); returns the count chosen."""
    n = available_cpus()
    candidates = [n, 1] if n > 1 else [1]
    best: dict[int, float] = {}
    for threads in candidates * 2:  # interleaved, best of both rounds
        torch.set_num_threads(threads)
        workload()
        start = time.perf_counter()
        for _ in range(repeats):
            workload()
        best[threads] = min(best.get(threads, float("inf")), time.perf_counter() - start)
    chosen = min(best, key=best.__getitem__)
    torch.set_num_threads(chosen)
    return chosen
