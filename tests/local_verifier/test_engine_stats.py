"""``Engine.stats``: the engine's typed snapshot (KV pool use, each tenant's requests
running and waiting, step time by rows, the thread choice) while requests are held in it."""

from __future__ import annotations

import threading
from typing import Any

from local_verifier.devices import available_cpus
from local_verifier.engine import END, Engine, GenerationRequest
from local_verifier.events import TenantLoad
from local_verifier.loader import LoadedModel
from local_verifier.step_costs import GRID

BUDGET, DRAFT = 32, 8


def test_stats_while_one_request_runs_and_others_wait(tiny_lm: LoadedModel) -> None:
    costs = [1e-3 + 1e-5 * r for r in range(BUDGET + DRAFT + 1)]
    engine = Engine(
        tiny_lm, max_draft=DRAFT, token_budget=BUDGET, row_costs=costs, kv_cache_mb=4, max_batch=1
    )
    entered, release = threading.Event(), threading.Event()

    def hold(item: Any) -> None:  # the engine thread waits here, a0 in the batch
        if item is not END and not entered.is_set():
            entered.set()
            release.wait(60)

    req = GenerationRequest(prompt_ids=[5, 6, 7], max_tokens=3, draft=False, owner="a")
    engine.submit(req, hold)
    assert entered.wait(60)
    engine.submit_n(req, 2, lambda i, item: None)
    other = GenerationRequest(prompt_ids=[9, 8], max_tokens=3, draft=False, owner="b")
    engine.submit(other, lambda item: None)

    held = engine.stats()
    assert held.tenants == {"a": TenantLoad(running=1, waiting=2), "b": TenantLoad(0, 1)}
    assert held.kv_blocks_total == engine.pool.n_blocks
    assert 0 < held.kv_blocks_used == engine.pool.used()
    assert held.memory["kv_in_use_bytes"] == held.kv_blocks_used * engine.pool.block_bytes()
    rows = [r for r in GRID if r <= BUDGET + DRAFT] + [BUDGET + DRAFT]
    assert list(held.step_s_by_rows) == rows
    # costs given (not measured): used as given, never updated, no thread choice
    assert held.step_s_by_rows == held.step_s_at_start == {r: costs[r] for r in rows}
    assert held.threads is None

    release.set()
    assert engine.wait_idle(60)
    idle = engine.stats()
    assert idle.tenants == {}
    assert idle.kv_blocks_used == 0
    engine.close()


def test_a_measured_engine_reports_its_thread_choice(engine: Engine) -> None:
    """The shared SmolLM2 engine measured its costs at start-up."""
    stats = engine.stats()
    cpus = available_cpus()
    if cpus == 1:  # nothing to choose between
        assert stats.threads is None
    else:
        assert stats.threads is not None
        assert stats.threads.candidates == (1, cpus)
        assert stats.threads.chosen in stats.threads.candidates
        assert set(stats.threads.score) == {1, cpus}
    assert all(s > 0 for s in stats.step_s_at_start.values())
    assert list(stats.step_s_by_rows) == list(stats.step_s_at_start)
