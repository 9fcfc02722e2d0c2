"""Device, dtype and CPU thread choices."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

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


NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags of bf16 arithmetic in hardware: where one is present the bf16 target is the
CPU default (half the bytes per token, and AMX tiles or bf16 dot products for batched rows)."""


def blocks_by_default(flags: set[str] | None = None) -> bool:
    """Whether a GGUF file's quantized blocks are the default target on this CPU (``flags``:
    its own unless given): on AVX2, AVX-512 and AMX CPUs. The blocks' kernels measured
    faster than the float target's at every row count on AVX2 and AVX-512, and on AMX up to
    16 rows (decode, drafted verify steps) though not at 64 or in prompt processing
    (docs/local-models.md)."""
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def default_dtype(device: torch.device, flags: set[str] | None = None) -> torch.dtype:
    """bf16 on CUDA and on CPUs with native bf16 arithmetic (``flags``: this CPU's unless
    given), else fp32."""
    if device.type == "cuda":
        return torch.bfloat16
    if device.type == "cpu" and (cpu_flags() if flags is None else flags) & set(NATIVE_BF16_FLAGS):
        return torch.bfloat16
    return torch.float32


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """``dtype`` by name, else ``default_dtype(device)``."""
    if dtype is None:
        return default_dtype(device)
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


T = TypeVar("T")


def on_own_thread(work: Callable[[], T]) -> T:
    """``work()`` on a thread of its own that ends with it (its exception re-raised here).

    The C++ kernels' OpenMP runtime keeps a team of threads for every thread that has run a
    step, for as long as that thread lives; once it manages more threads than there are
    CPUs it barely spins at a barrier, and each of a step's ~60 parallel regions then waits
    for a wake-up (a step about 2x slower: benchmarks/RESULTS.md, "a slowdown found").
    Calibration steps run here leave no team behind; a thread that stays (the one that
    loaded the model, the engine thread when idle) frees its own with
    ``kernels.cpp.release_threads``, so a busy engine thread's team is the only one.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dg-calibrate") as pool:
        return pool.submit(work).result()


def configure_threads(
    workload: Callable[[], object],
    repeats: int = 3,
    min_seconds: float = 0.25,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Set torch's CPU threads to one per available CPU or to 1, whichever runs ``workload``
    faster now (on a busy machine the threads' synchronisation can cost more than they
    gain); returns the count chosen.

    Each count is timed twice, interleaved, after one untimed run of each (the first pages
    in the weights, a count's first builds its team); a timing runs ``workload`` until
    ``min_seconds`` have passed, at most ``repeats`` times, and the best time per run
    decides. A workload of a 1B model (a quarter to half a second a run) is thus timed
    once a round, a small model's up to ``repeats`` times."""
    n = available_cpus()
    candidates = [n, 1] if n > 1 else [1]
    best: dict[int, float] = {}
    for first_round in (True, False):
        for threads in candidates:
            torch.set_num_threads(threads)
            if first_round:
                workload()
            start, runs = clock(), 0
            while True:
                workload()
                runs += 1
                elapsed = clock() - start
                if runs >= repeats or elapsed >= min_seconds:
                    break
            best[threads] = min(best.get(threads, math.inf), elapsed / runs)
    chosen = min(best, key=best.__getitem__)
    torch.set_num_threads(chosen)
    return chosen


class ThreadTuner:
    """Keeps choosing torch's CPU thread count while an engine serves, by measured steps.

    ``configure_threads`` decides once, at load, under whatever else ran then: a machine
    busy for those few seconds leaves a server on one thread for good (a batched step then
    costs ~1.3x). Here every ``explore_every`` steps the next ``explore_steps`` forwards run
    on another candidate count, each forward's time is compared with what the cost table
    expects for its rows, and the count whose recent steps ran fastest against it is kept.
    A step's values do not depend on the thread count (the kernels' sums are fixed per
    row), so switching never changes an answer.

    Another process computing on the same cores can make a multi-thread step ~100x slower
    (each of its parallel regions waits at a barrier for a thread the scheduler took away:
    a 10 ms step took 1.4 s beside a 2-thread torch loop on 2 cores), while one thread only
    shares its core. So a forward over ``alarm`` times its expected cost calls a trial at
    once rather than at the next turn (unless trials are backing off), a trial step over
    ``alarm`` and worse than the chosen count ends its trial there, and each trial ended
    so doubles the wait before the next one (up to ``max_backoff`` turns; a trial run to
    its end resets it).

    A trial runs on short forwards only, those expected to cost at most ``trial_cost``
    one-row forwards; a longer one during a trial runs on the chosen count, outside it. On
    the workload's code edits (1.1B Q4_K_M file, Zen 4, a scratch trace), the trials' 16
    steps on one thread cost 0.94 s more than on two, 0.43 s of it one prompt's 128-row
    forward; with trials on forwards of at most twice a one-row forward's cost, 0.37 s.
    """

    def __init__(
        self,
        candidates: list[int],
        explore_every: int = 128,
        explore_steps: int = 4,
        decay: float = 0.25,
        margin: float = 0.03,
        alarm: float = 4.0,
        max_backoff: int = 8,
        trial_cost: float = 2.0,
    ) -> None:
        if not candidates or min(candidates) < 1:
            raise ValueError("candidates must be thread counts >= 1")
        self.candidates = sorted(set(candidates))
        current = torch.get_num_threads()
        self.chosen = current if current in self.candidates else self.candidates[-1]
        self.explore_every = explore_every
        self.explore_steps = explore_steps
        self.decay = decay
        self.margin = margin
        self.alarm = math.log(alarm)
        self.max_backoff = max_backoff
        self.trial_cost = trial_cost
        self.score: dict[int, float | None] = dict.fromkeys(self.candidates)
        """Per count: the running mean of log(step seconds / expected seconds)."""
        self.backoff = 1  # turns of ``explore_every`` steps between trials
        self._steps = max(explore_every - 16, 0)  # the first trial comes soon after start-up
        self._trials = 0
        self._trial: int | None = None
        self._trial_left = 0
        self._on_trial = False  # the coming forward is a trial step

    def apply(self, cost: float = 1.0) -> int:
        """Set the thread count for the coming forward, expected to cost ``cost`` one-row
        forwards (returns it)."""
        self._steps += 1
        due = self._steps >= self.explore_every * self.backoff
        if self._trial is None and len(self.candidates) > 1 and due:
            others = [n for n in self.candidates if n != self.chosen]
            self._trial = others[self._trials % len(others)]
            self._trials += 1
            self._trial_left = self.explore_steps
            self._steps = 0
        self._on_trial = self._trial is not None and cost <= self.trial_cost
        threads = self._trial if self._trial is not None and self._on_trial else self.chosen
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def observe(self, ratio: float) -> bool:
        """Record the forward just run: its seconds over the expected seconds. Returns
        whether the cost table should learn from it: it ran on the chosen count and did
        not stall (a trial step's time says nothing about the table)."""
        trial = self._trial if self._on_trial else None
        threads = self.chosen if trial is None else trial
        x = math.log(ratio) if ratio > 0 else None
        if x is not None:
            old = self.score[threads]
            self.score[threads] = x if old is None else old + self.decay * (x - old)
        chosen = self.score[self.chosen]
        if trial is None:
            if (
                x is not None
                and x > self.alarm
                and self.backoff == 1
                and self._steps >= self.explore_steps
            ):
                self._steps = self.explore_every  # a trial on the next step
                return False  # a stall, not what the cost table should learn
            return True
        self._trial_left -= 1
        if x is not None and x > self.alarm and (chosen is None or x > chosen + self.margin):
            self.score[trial] = None  # says nothing of it once the cores are free
            self._trial = None  # struggling: no more of its steps now, and fewer trials
            self.backoff = min(2 * self.backoff, self.max_backoff)
        elif self._trial_left <= 0:
            score = self.score[trial]
            if score is not None and (chosen is None or score < chosen - self.margin):
                self.chosen = trial
            self._trial = None
            self.backoff = 1
        return False
