"""Continuous batching: between steps ``Admission`` decides who runs (places, KV blocks,
preemption), then ``StepRunner`` runs one ``Transformer.step`` over every running request.

Only the scheduler's thread touches the pool, the model and the requests' state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from local_verifier.admission import Admission
from local_verifier.devices import ThreadTuner
from local_verifier.fair_queue import FairQueue
from local_verifier.kv_pool import KVPool
from local_verifier.model import Transformer
from local_verifier.request import Request
from local_verifier.row_prices import RowPrice
from local_verifier.step import StepRunner
from local_verifier.step_costs import LiveCosts


class Scheduler:
    """Admits, batches and advances requests, one ``Transformer.step`` per call of ``step``."""

    def __init__(
        self,
        model: Transformer,
        pool: KVPool,
        row_costs: Sequence[float],
        token_budget: int = 256,
        max_batch: int = 16,
        prefix_cache: bool = True,
        clock: Callable[[], float] | None = time.perf_counter,
        threads: ThreadTuner | None = None,
        price: RowPrice | None = None,
    ) -> None:
        """``row_costs``, ``clock``, ``threads``, ``price``: as ``StepRunner`` takes them."""
        self.places = Admission(pool, max_batch, prefix_cache)
        self.runner = StepRunner(
            model, pool, self.places, row_costs, token_budget, clock, threads, price
        )

    @property
    def waiting(self) -> FairQueue[Request]:
        return self.places.waiting

    @property
    def max_batch(self) -> int:
        return self.places.max_batch

    @property
    def costs(self) -> LiveCosts:
        return self.runner.costs

    def has_work(self) -> bool:
        return self.places.has_work()

    def fail_all(self, error: Exception) -> None:
        """End every request (a forward failed): each owner gets ``error``."""
        self.places.fail_all(error)

    def step(self) -> None:
        """Admit what fits, run one forward over every active request, deliver the output."""
        self.places.drop_cancelled()
        self.places.admit()
        self.places.grow()
        if self.places.running:
            self.runner.run()
