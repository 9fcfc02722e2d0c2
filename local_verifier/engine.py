"""The generation engine the gateway runs: one loaded model serving many requests at once.

One engine thread runs the :class:`~local_verifier.scheduler.Scheduler` (continuous
batching over a paged KV pool, speculative decoding per request with drafts sized for the
batch). ``submit`` is thread-safe and hands each request's events
(``local_verifier.events``) to a callback on the engine thread; ``generate`` is a blocking
iterator over the same path.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import queue
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from local_verifier.devices import ThreadTuner, available_cpus
from local_verifier.errors import (
    EngineBusy,
    EngineClosed,
    PromptTooLong,
    TenantBusy,
)
from local_verifier.events import (
    END,
    Ended,
    EngineStats,
    Event,
    Failed,
    GenerationStats,
    TenantLoad,
    ThreadChoice,
    answer_stats,
)
from local_verifier.grammar import GrammarCompiler
from local_verifier.heap import release_freed
from local_verifier.kernels.cpp import release_threads
from local_verifier.kv_pool import DEFAULT_BLOCK_SIZE, KVPool
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel, load_model
from local_verifier.logprobs import MAX_TOP_LOGPROBS
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.prompts import PromptEncoder
from local_verifier.request import DocumentTokens, GenerationRequest, Request
from local_verifier.sampling import MAX_SEED, make_generator
from local_verifier.scheduler import Scheduler
from local_verifier.step_costs import measure_row_costs
from lookup.controller import DraftController
from lookup.drafter import Drafter
from lookup.index import IndexCache
from lookup.native import load_library as load_drafter_library
from lookup.prompt_index import PromptIndexCache
from lookup.protocols import DraftPolicy, DraftSource

__all__ = [
    "END",
    "DocumentTokens",
    "Engine",
    "EngineStats",
    "Event",
    "Failed",
    "GenerationRequest",
    "GenerationStats",
    "TextDelta",
]

MAX_DRAFT = 64  # largest draft per request per step
DEFAULT_KV_CACHE_MB = 512
TOKEN_BUDGET = 128  # prompt rows per step (decode rows always run)
MAX_BATCH = 16  # requests running at once
MAX_QUEUE = 64  # requests waiting beyond those running
PROMPT_INDEX_BYTES = 64 << 20  # the drafter's cached prompt-prefix indexes


class Handle:
    """A submitted request (or ``n`` of them): ``cancel()`` frees their slots at the engine's
    next step."""

    def __init__(self, engine: Engine, requests: list[Request]) -> None:
        self._engine = engine
        self._requests = requests

    def prompt_tokens(self) -> tuple[int, int]:
        """The prompt's tokens and how many of them the prefix cache held (answer 0's, as
        admitted: known once its first item is out)."""
        first = self._requests[0]
        return len(first.prompt_ids), first.cached_tokens

    def cancel(self) -> None:
        for request in self._requests:
            request.cancelled = True
        self._engine._wake()


class Engine:
    """Loads a model once and serves submitted requests from one engine thread."""

    def __init__(
        self,
        model: str | LoadedModel = "smollm2-135m",
        device: str | None = None,
        dtype: str | None = None,
        max_draft: int = MAX_DRAFT,
        *,
        kv_cache_mb: float | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        token_budget: int = TOKEN_BUDGET,
        max_batch: int = MAX_BATCH,
        max_queue: int = MAX_QUEUE,
        row_costs: Sequence[float] | None = None,
        prefix_cache: bool = True,
        tenant_places: int | None = None,
    ) -> None:
        """``row_costs[r]``: seconds of a step with r rows, r = 0..token_budget + max_draft,
        used as given (measured at start-up when None, then kept up to date by the steps
        run). ``prefix_cache``: reuse the K/V of full blocks of
        earlier requests' committed tokens and the drafter's prompt index (per
        ``GenerationRequest.tenant``). ``max_batch + max_queue`` places bound the requests
        running and waiting; ``tenant_places`` (None: all of them) those of one owner."""
        mb = DEFAULT_KV_CACHE_MB if kv_cache_mb is None else kv_cache_mb
        if not isinstance(model, LoadedModel):
            model = load_model(model, device, dtype, kv_cache_mb=mb)
        self.lm = model
        self.tokenizer = self.lm.tokenizer
        self.name = self.lm.name
        cfg = self.lm.config
        model_ = self.lm.model
        per_block = KVStorage.bytes_per_slot(cfg, model_.kv_dtype) * block_size
        n_blocks = max(int(mb * 2**20) // per_block, 1)
        storage = KVStorage(cfg, n_blocks * block_size, device=model_.device, dtype=model_.kv_dtype)
        self.pool = KVPool(storage, block_size)
        self.context_length = min(self.lm.context_length, n_blocks * block_size)
        self.max_draft = max(min(max_draft, self.context_length - 1), 0)
        max_rows = token_budget + self.max_draft
        measured = row_costs is None
        if model_.device.type == "cpu":
            release_threads()  # this thread's team would slow the calibration and the engine's
        if row_costs is None:
            row_costs = measure_row_costs(self.lm, max_rows, storage)
            release_freed()  # what steps of every size let go
        if len(row_costs) != max_rows + 1:
            raise ValueError(f"row_costs must give {max_rows + 1} step costs")
        self.row_costs = list(row_costs)
        # one request's step with k draft tokens, for its controller: c(1 + k)
        self.step_costs = self.row_costs[1 : self.max_draft + 2]
        load_drafter_library()  # built (once per machine) and loaded now, not by a request
        self.index_cache = IndexCache()
        # the drafter's prompt index, by prefix (bound 0: nothing kept)
        self.prompt_indexes = PromptIndexCache(max_bytes=PROMPT_INDEX_BYTES if prefix_cache else 0)
        self.grammars = GrammarCompiler(self.tokenizer, cfg.vocab_size)
        self._prompts = PromptEncoder(self.tokenizer, cfg.vocab_size, self.context_length)
        self.max_queue = max_queue
        self._scheduler = Scheduler(
            model_,
            self.pool,
            self.row_costs,
            token_budget,
            max_batch,
            prefix_cache,
            clock=time.perf_counter if measured else None,
            threads=_thread_tuner(model_.device) if measured else None,
        )
        self._max_outstanding = max_batch + max_queue
        self._tenant_places = self._max_outstanding if tenant_places is None else tenant_places
        self._owned: dict[str, int] = {}  # owner -> its requests running or waiting
        self._cond = threading.Condition()
        self._inbox: list[list[tuple[Request, GenerationRequest]]] = []
        self._outstanding = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- submitting ------------------------------------------------------------------------

    def submit(
        self,
        req: GenerationRequest,
        on_item: Callable[[Event], None],
        *,
        drafter: DraftSource | None = None,
        controller: DraftPolicy | None = None,
    ) -> Handle:
        """Queue ``req``; ``on_item`` gets its events (``local_verifier.events``) on the
        engine thread: each ``TextDelta``, then ``GenerationStats`` or ``Failed``, then
        ``END`` (after a cancel: just ``END``).

        Raises ``PromptTooLong``/``ValueError`` (bad request; ``InvalidGrammar`` for its
        grammar) or ``EngineBusy`` (queue full) here. The grammar is compiled here, on the
        calling thread. ``drafter``/``controller`` replace the request's own lookup drafter
        and controller (tests inject fixed drafts this way).
        """
        req = self._prompts.tokenised(req)
        request = self._request(req, on_item, drafter, controller)
        self._constrain([request], req)
        return self._enqueue([(request, req)])

    def submit_n(
        self, req: GenerationRequest, n: int, on_item: Callable[[int, Event], None]
    ) -> Handle:
        """Queue ``n`` answers to ``req``'s prompt; ``on_item(i, item)`` as in ``submit``.

        Answer ``i`` is the answer ``req`` with seed ``seed + i`` gets alone (unseeded:
        its own random stream), with its own drafts. Answers ``1..n-1`` are admitted once
        answer 0's prompt is in the pool and read its full blocks from the prefix cache,
        so the prompt is computed once; the grammar is compiled once, here, and each answer
        masks with its own copy. ``cancel()`` on the handle cancels all ``n``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        seed = req.params.seed
        if seed is not None and seed + n - 1 > MAX_SEED:
            raise ValueError(f"seed must be at most 2**64 - n = {MAX_SEED - n + 1} with n = {n}")
        req = self._prompts.tokenised(req)
        group: list[tuple[Request, GenerationRequest]] = []
        for i in range(n):
            params = dataclasses.replace(req.params, seed=None if seed is None else seed + i)
            member = dataclasses.replace(req, params=params)
            group.append((self._request(member, functools.partial(on_item, i)), member))
        self._constrain([request for request, _ in group], req)
        group[0][0].followers = [request for request, _ in group[1:]]
        return self._enqueue(group)

    def _request(
        self,
        req: GenerationRequest,
        on_item: Callable[[Event], None],
        drafter: DraftSource | None = None,
        controller: DraftPolicy | None = None,
    ) -> Request:
        """The scheduler's request for ``req`` (raises on a bad request)."""
        assert req.prompt_ids is not None  # PromptEncoder.tokenised
        prompt_ids = req.prompt_ids
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise PromptTooLong(len(prompt_ids), self.context_length)
        if req.max_tokens is not None and req.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {req.max_tokens}")
        top = req.logprobs
        if top is not None and (
            isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top!r}")
        if not (isinstance(req.weight, int | float) and 0 < req.weight < float("inf")):
            raise ValueError(f"weight must be a positive number, got {req.weight!r}")
        max_new = room if req.max_tokens is None else min(req.max_tokens, room)
        req.penalties.check_vocab(self.lm.config.vocab_size)
        params = req.params
        device = self.lm.model.device
        return Request(
            prompt_ids=prompt_ids,
            max_new=max_new,
            params=params,
            generator=None if params.greedy else make_generator(params.seed, device),
            drafter=drafter if req.draft else None,
            controller=controller if req.draft else None,
            max_draft=self.max_draft
            if req.max_draft is None
            else min(req.max_draft, self.max_draft),
            output=OutputAssembler(self.tokenizer, req.stop, max_new),
            on_delta=on_item,
            on_finish=lambda r, error: self._finished(r, error, req, on_item),
            tenant=req.tenant,
            owner=req.owner,
            weight=req.weight,
            penalties=req.penalties,
            logprobs=top,
        )

    def _constrain(self, requests: list[Request], req: GenerationRequest) -> None:
        """Compile ``req``'s grammar (after its cheaper checks, on the submitting thread:
        never the engine thread) and give each of its answers a copy."""
        if req.grammar is None:
            return
        compiled = self.grammars.compile(req.grammar)
        for request in requests:
            request.grammar = compiled.constraint()

    def _enqueue(self, group: list[tuple[Request, GenerationRequest]]) -> Handle:
        """Hand a request (and its followers) to the engine thread."""
        with self._cond:
            if self._closed:
                raise EngineClosed("the local engine is closed")
            if self._outstanding + len(group) > self._max_outstanding:
                raise EngineBusy(self._outstanding - self._scheduler.max_batch)
            owner = group[0][1].owner
            owned = self._owned.get(owner, 0)
            if owned + len(group) > self._tenant_places:
                raise TenantBusy(owned, self._tenant_places)
            self._owned[owner] = owned + len(group)
            self._outstanding += len(group)
            self._inbox.append(group)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name=f"dg-engine-{self.name}", daemon=True
                )
                self._thread.start()
                # stopped before the interpreter tears down what a running step uses (a
                # step still in C++ then aborted the process)
                atexit.register(_close_at_exit, weakref.ref(self))
            self._cond.notify()
        return Handle(self, [request for request, _ in group])

    @property
    def full(self) -> bool:
        """Whether ``submit`` would refuse a request now (every batch and queue place taken)."""
        return self._outstanding >= self._max_outstanding

    def generate(
        self,
        req: GenerationRequest,
        *,
        drafter: DraftSource | None = None,
        controller: DraftPolicy | None = None,
    ) -> Iterator[TextDelta | GenerationStats]:
        """Stream ``TextDelta``s, then one ``GenerationStats`` (blocking; built on ``submit``).

        Raises ``PromptTooLong`` or ``ValueError`` here, before anything is yielded;
        closing the iterator early cancels the request.
        """
        items: queue.SimpleQueue[Event] = queue.SimpleQueue()
        handle = self.submit(req, items.put, drafter=drafter, controller=controller)
        return _drain(items, handle)

    def stats(self) -> EngineStats:
        """The engine's counters so far and its state now (read off the engine thread:
        each figure is current or a step behind)."""
        places = self._scheduler.places
        running = Counter(r.owner for r in list(places.running))
        with self._cond:
            owned = dict(self._owned)
        costs = self._scheduler.costs
        now, start = costs.table, costs.startup
        tuner = self._scheduler.runner.threads
        return EngineStats(
            preemptions=places.preemptions,
            prefix_hit_tokens=places.hit_tokens,
            prefix_miss_tokens=places.miss_tokens,
            memory=self.memory(),
            kv_blocks_used=self.pool.used(),
            kv_blocks_total=self.pool.n_blocks,
            tenants={
                owner: TenantLoad(min(running[owner], n), max(n - running[owner], 0))
                for owner, n in sorted(owned.items())
            },
            step_s_by_rows={int(r): now[r] for r in costs.grid},
            step_s_at_start={int(r): float(start[r]) for r in costs.grid},
            threads=None
            if tuner is None
            else ThreadChoice(tuner.chosen, tuple(tuner.candidates), dict(tuner.score)),
        )

    def memory(self) -> dict[str, int]:
        """Bytes: model weights, KV pool reserved and in use, document indexes."""
        weights = sum(p.numel() * p.element_size() for p in self.lm.model.parameters())
        pool = self.pool
        return {
            "weights_bytes": int(weights),
            "kv_reserved_bytes": int(pool.storage.nbytes()),
            "kv_in_use_bytes": int(pool.used() * pool.block_bytes()),
            "kv_peak_bytes": int(pool.peak_used * pool.block_bytes()),
            "kv_cached_bytes": int(pool.cached() * pool.block_bytes()),
            "index_bytes": int(self.index_cache.nbytes() + self.prompt_indexes.nbytes()),
        }

    def wait_idle(self, timeout: float) -> bool:
        """Block until every submitted request has ended (False if ``timeout`` s pass first)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread after its current step: requests still queued or running
        end with ``EngineClosed``, later ``submit`` calls raise it. Waits up to ``timeout``
        seconds for the thread; calling it again does nothing more."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the engine thread -------------------------------------------------------------------

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _loop(self) -> None:
        scheduler = self._scheduler
        cpu = self.lm.device.type == "cpu"
        while True:
            with self._cond:
                while not self._closed and not self._inbox and not scheduler.has_work():
                    if cpu:  # idle: no team of ours to slow another thread's parallel work
                        release_threads()
                    self._cond.wait()
                arrived, self._inbox = self._inbox, []
            if self._closed:
                closed = EngineClosed("the local engine was closed")
                for group in arrived:
                    for request, _ in group:
                        request.on_finish(request, closed)
                scheduler.fail_all(closed)
                return
            for group in arrived:
                try:
                    for request, req in group:
                        self._prepare(request, req)
                except Exception as exc:  # ends only this request (and its n siblings)
                    for request, _ in group:
                        request.on_finish(request, exc)
                    continue
                scheduler.waiting.append(group[0][0])  # followers: when its prompt is in
            try:
                scheduler.step()
            except Exception as exc:  # a failed forward ends every request in it
                scheduler.fail_all(exc)

    def _prepare(self, request: Request, req: GenerationRequest) -> None:
        """Build the request's drafter and controller (on the engine thread)."""
        if not req.draft:
            return
        if request.drafter is None:
            request.drafter = self._drafter(req, request.prompt_ids)
        if request.controller is None:
            request.controller = DraftController(self.step_costs[: request.max_draft + 1])

    def _finished(
        self,
        request: Request,
        error: Exception | None,
        req: GenerationRequest,
        on_item: Callable[[Event], None],
    ) -> None:
        with self._cond:
            self._outstanding -= 1
            left = self._owned[req.owner] - 1
            if left:
                self._owned[req.owner] = left
            else:
                del self._owned[req.owner]
            self._cond.notify_all()
        if error is not None:
            on_item(Failed(error))
        elif not request.cancelled:
            on_item(answer_stats(request, bool(req.prediction)))
        on_item(END)

    def _drafter(self, req: GenerationRequest, prompt_ids: Sequence[int]) -> Drafter:
        prediction = req.prediction_ids or None
        documents = [self.index_cache.get_or_build(key, tokens) for key, tokens in req.documents]
        return Drafter(
            prompt_ids,
            prediction=prediction,
            documents=documents,
            document_sources=req.document_sources,
            prompt_index=self.prompt_indexes.index(prompt_ids, req.tenant),
        )


def _thread_tuner(device: Any) -> ThreadTuner | None:
    """On a CPU with more than one core: the online choice between one thread and all."""
    cpus = available_cpus()
    return ThreadTuner([1, cpus]) if device.type == "cpu" and cpus > 1 else None


def _drain(
    items: queue.SimpleQueue[Event], handle: Handle
) -> Iterator[TextDelta | GenerationStats]:
    try:
        while not isinstance(item := items.get(), Ended):
            if isinstance(item, Failed):
                raise item.error
            yield item
    finally:
        handle.cancel()


def _close_at_exit(engine: weakref.ref[Engine]) -> None:
    alive = engine()
    if alive is not None:
        alive.close(timeout=10.0)
