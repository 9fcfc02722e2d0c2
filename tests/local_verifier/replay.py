"""Serving replayed offline: the real scheduler, drafters and draft sizing over recorded
greedy answers, timed by a step-cost table instead of a clock.

A stand-in model writes each row's token into a one-slot K/V storage and answers every row
with all mass on the token the recorded answer puts after that row's context (any token
for a context off the answer: greedy verification never reads past a mismatch). So each
request emits exactly its recorded answer, through the same admission, prompt chunks,
drafts, verification and tree compaction as the engine, and a step costs
``costs(rows)`` of virtual time. Clients run closed loop: ``concurrency`` of them, each
sending its next request when its last answer ended. The scheduler's decisions are then
checked by modeled throughput and latency, deterministically.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from local_verifier.config import ModelConfig
from local_verifier.kv_pool import KVPool
from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.request import Request
from local_verifier.sampling import SamplingParams
from local_verifier.scheduler import Scheduler
from local_verifier.tokenizer import Tokenizer
from lookup.controller import DraftController
from lookup.drafter import Drafter

__all__ = ["Answer", "ReplayModel", "Replay", "StepCostTable", "replay"]


@dataclass(frozen=True)
class Answer:
    """One recorded request: its prompt ids, the greedy answer's ids and its token limit
    (an answer shorter than ``max_new`` ended with an end-of-sequence token)."""

    id: str
    prompt_ids: list[int]
    output_ids: list[int]
    max_new: int


class StepCostTable:
    """Seconds of a step by its row count: linear between measured points, the last
    segment's slope past the largest (one row's cost below it)."""

    def __init__(self, points: Mapping[int, float]) -> None:
        if len(points) < 2 or any(r < 1 or s <= 0 for r, s in points.items()):
            raise ValueError("step costs need two or more row counts >= 1, positive seconds")
        self.rows = sorted(points)
        self.seconds = [float(points[r]) for r in self.rows]
        (r0, r1), (s0, s1) = self.rows[-2:], self.seconds[-2:]
        self._slope = (s1 - s0) / (r1 - r0)

    def __call__(self, rows: int) -> float:
        if rows > self.rows[-1]:
            return self.seconds[-1] + self._slope * (rows - self.rows[-1])
        return float(np.interp(max(rows, 1), self.rows, self.seconds))

    def table(self, max_rows: int) -> list[float]:
        """``row_costs`` as the engine measures them: index r = a step of r rows, 0..max_rows."""
        return [self(r) for r in range(max_rows + 1)]


@dataclass(frozen=True)
class StepRecord:
    """What one forward step carried."""

    rows: int
    seqs: int
    prompt_rows: int
    cost_s: float


class ReplayModel:
    """Stands in for ``Transformer`` in the scheduler: logits from the recorded answers."""

    def __init__(
        self,
        answers: Sequence[Answer],
        tokenizer: Tokenizer,
        costs: StepCostTable,
    ) -> None:
        self.config = ModelConfig(
            vocab_size=tokenizer.vocab_size, dim=1, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=1,
            hidden_dim=1, max_seq_len=1 << 20,
        )  # fmt: skip
        self.costs = costs
        self.now = 0.0  # virtual seconds
        self.log: list[StepRecord] = []
        self._next: dict[tuple[int, ...], int] = {}
        eos = min(tokenizer.eos_ids)
        for a in answers:
            seq = [*a.prompt_ids, *a.output_ids]
            if len(a.output_ids) < a.max_new:
                seq.append(eos)
            for end in range(len(a.prompt_ids), len(seq)):
                self._next[tuple(seq[:end])] = seq[end]

    def step(self, seqs: Sequence[SeqStep], kv: KVStorage) -> list[torch.Tensor]:
        out = []
        for s in seqs:
            kv.v[0, s.new_slots, 0, 0] = s.tokens.to(kv.v.dtype)
            context = kv.v[0, s.context_slots, 0, 0].tolist()
            tokens = s.tokens.tolist()
            rows = range(len(tokens)) if s.logits == "all" else [len(tokens) - 1]
            logits = torch.zeros((len(rows) if s.logits != "none" else 0, self.config.vocab_size))
            if s.logits != "none":
                for i, row in enumerate(rows):
                    if s.mask is None:
                        path = tokens[: row + 1]
                    else:
                        path = [t for t, m in zip(tokens, s.mask[row].tolist(), strict=True) if m]
                    logits[i, self._next.get((*context, *path), 0)] = 1.0
            out.append(logits)
        rows_total = sum(len(s.tokens) for s in seqs)
        prompt_rows = sum(len(s.tokens) for s in seqs if s.logits != "all")
        cost = self.costs(rows_total)
        self.now += cost
        self.log.append(StepRecord(rows_total, len(seqs), prompt_rows, cost))
        return out

    def step_chunked(
        self, seqs: Sequence[SeqStep], kv: KVStorage, max_rows: int
    ) -> list[torch.Tensor]:
        return self.step(seqs, kv)  # its logits are one-hot rows: nothing to bound


@dataclass
class _Done:
    id: str
    submitted: float
    first: float | None = None
    ended: float = 0.0
    tokens: list[int] = field(default_factory=list)


@dataclass
class Replay:
    """The outcome of one replayed level: per-request times and the step log."""

    concurrency: int
    drafts: bool
    requests: list[_Done]
    steps: list[StepRecord]
    final_costs: list[float]  # the scheduler's step-cost table at the end (kept up to date)

    @property
    def makespan(self) -> float:
        return max(r.ended for r in self.requests) - min(r.submitted for r in self.requests)

    def summary(self) -> dict[str, object]:
        """Modeled output tokens/s, TTFT and e2e percentiles (ms), rows and steps."""

        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]

        def stat(values: list[float]) -> dict[str, float]:
            ms = [v * 1000 for v in values]
            return {"p50": round(pct(ms, 50), 1), "p99": round(pct(ms, 99), 1)}

        tokens = sum(len(r.tokens) for r in self.requests)
        rows = sum(s.rows for s in self.steps)
        return {
            "concurrency": self.concurrency,
            "drafts": self.drafts,
            "output_tok_s": round(tokens / self.makespan, 2),
            "ttft_ms": stat([(r.first or r.ended) - r.submitted for r in self.requests]),
            "e2e_ms": stat([r.ended - r.submitted for r in self.requests]),
            "steps": len(self.steps),
            "rows": rows,
            "rows_per_token": round(rows / tokens, 3),
            "tokens_per_step": round(tokens / len(self.steps), 3),
            "mean_rows_per_step": round(rows / len(self.steps), 2),
        }


def replay(
    answers: Sequence[Answer],
    tokenizer: Tokenizer,
    costs: StepCostTable,
    *,
    concurrency: int,
    drafts: bool,
    max_draft: int = 64,
    token_budget: int = 128,
    max_batch: int = 16,
    kv_slots: int = 1 << 16,
    client_s: float = 0.0,
    warm: bool = False,
    startup: StepCostTable | None = None,
) -> Replay:
    """Serve every answer once, closed loop at ``concurrency``, in virtual time (greedy).

    A client sends its next request ``client_s`` after its last answer ended (it waits for
    the step in flight). ``warm``: every prompt was served before, so its full blocks are
    in the prefix cache. ``startup``: the step costs the scheduler starts from, as if measured at start-up
    (default ``costs``); it keeps them up to date with the steps' modeled times.
    """
    model = ReplayModel(answers, tokenizer, costs)
    storage = KVStorage(model.config, kv_slots, dtype=torch.long)
    row_costs = (startup or costs).table(token_budget + max_draft)
    scheduler = Scheduler(
        model,  # type: ignore[arg-type]
        KVPool(storage),
        row_costs,
        token_budget,
        max_batch,
        prefix_cache=warm,
        clock=lambda: model.now,
    )
    step_costs = row_costs[1 : max_draft + 2]
    todo = list(answers)
    done: list[_Done] = []
    arrivals: list[tuple[float, Request]] = []

    def request(answer: Answer, record: _Done | None, max_new: int, drafting: bool) -> Request:
        def on_delta(delta: TextDelta) -> None:
            if record is not None:
                record.first = model.now if record.first is None else record.first
                record.tokens += delta.token_ids

        def on_finish(_req: Request, error: Exception | None) -> None:
            if error is not None:
                raise error
            if record is not None:
                record.ended = model.now
                arrive(model.now + client_s)

        return Request(
            prompt_ids=list(answer.prompt_ids),
            max_new=max_new,
            params=SamplingParams(temperature=0.0),
            generator=None,
            drafter=Drafter(answer.prompt_ids) if drafting else None,
            controller=DraftController(step_costs) if drafting else None,
            max_draft=max_draft,
            output=OutputAssembler(tokenizer, [], max_new),
            on_delta=on_delta,
            on_finish=on_finish,
        )

    def arrive(at: float) -> None:
        if todo:
            answer = todo.pop(0)
            record = _Done(answer.id, at)
            done.append(record)
            arrivals.append((at, request(answer, record, answer.max_new, drafts)))

    if warm:  # prefill every prompt once, untimed
        scheduler.waiting.extend(request(a, None, 1, False) for a in answers)
        while scheduler.has_work():
            scheduler.step()
        model.now, model.log = 0.0, []
    for _ in range(concurrency):
        arrive(0.0)
    while arrivals or scheduler.has_work():
        if not scheduler.has_work():
            model.now = max(model.now, min(t for t, _ in arrivals))
        scheduler.waiting.extend(r for t, r in arrivals if t <= model.now)
        arrivals = [(t, r) for t, r in arrivals if t > model.now]
        stepped = len(model.log)
        scheduler.step()
        if len(model.log) == stepped:
            raise RuntimeError("the scheduler made no progress")
    for record, answer in zip(done, answers, strict=True):
        if record.tokens != answer.output_ids:
            raise AssertionError(f"{answer.id}: the replay diverged from the recorded answer")
    final = scheduler.costs.table
    return Replay(concurrency, drafts, done, model.log, final)
