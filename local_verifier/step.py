"""One step of continuous batching: a single ``Transformer.step`` over every running request.

The step carries, for every decoding request, its pending token plus the draft chosen for
it (chain or tree, sized for its tenant's requests by ``lookup.controller.plan_batch``), and
prompt chunks of requests still in prefill, up to a token budget per step that tenants
share by weight; which requests decode and how long their drafts are follow each tenant's
share of the step's cost (``step_shares``). Each row's logits are then verified (greedy or
sampled, losslessly) and the accepted tokens emitted; one request's failure ends only that
request.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from local_verifier.admission import Admission
from local_verifier.devices import ThreadTuner
from local_verifier.draft_shares import HostTimes, fair_plan, pending_cost
from local_verifier.fair_queue import split
from local_verifier.grammar import DraftRowOverLimit, GrammarLimitExceeded
from local_verifier.kv_pool import BlockTable, KVPool
from local_verifier.kv_storage import KVStorage
from local_verifier.logits_processors import PenaltyState
from local_verifier.logprobs import TokenLogprob, token_logprobs
from local_verifier.model import SeqStep, Transformer
from local_verifier.request import Request
from local_verifier.row_prices import RowPrice
from local_verifier.sampling import SamplingParams, sample, target_probs
from local_verifier.step_costs import LiveCosts
from local_verifier.step_logits import LOGIT_ROWS, ChunkedLogits
from local_verifier.step_shares import StepShares
from local_verifier.tree import tree_mask
from local_verifier.verify import (
    RowProbs,
    Verdict,
    verify_greedy,
    verify_greedy_batch,
    verify_sampled,
)
from lookup.controller import plan_batch
from lookup.draft import Draft

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _Row:
    """What one sequence contributed to a step."""

    request: Request
    draft: Draft | None  # None: a prompt chunk


class StepRunner:
    """Builds a step's rows, plans the drafts, runs the forward, verifies and emits."""

    def __init__(
        self,
        model: Transformer,
        pool: KVPool,
        places: Admission,
        row_costs: Sequence[float],
        token_budget: int = 256,
        clock: Callable[[], float] | None = time.perf_counter,
        threads: ThreadTuner | None = None,
        price: RowPrice | None = None,
    ) -> None:
        """``row_costs[r]``: the start-up measured seconds of a step of r rows; the draft plan
        uses them as kept up to date by the forwards run, timed with ``clock`` (None: as
        given, never updated). ``threads``: chooses the CPU thread count from the timed
        forwards (needs ``clock``). ``price``: what a row costs by its context, for the
        tenants' shares of a step (None: modelled from the model's shape); each request's
        host time per step counts too, timed with ``clock``."""
        self.model = model
        self.pool = pool
        self.places = places
        self.costs = LiveCosts(row_costs)
        self.clock = clock
        self.threads = threads if clock is not None else None
        self.token_budget = token_budget
        self.vocab_size = model.config.vocab_size
        self._steps = 0  # steps run, for ``Request.turn``
        self._prefill_credit: dict[str, float] = {}  # tenants' carried prefill shares
        if price is None:
            storage = pool.storage
            per_token = KVStorage.bytes_per_slot(model.config, storage.k.dtype)
            price = RowPrice.for_model(model, per_token)
        self.price = price
        self.shares = StepShares()
        self.host = HostTimes()

    def run(self) -> None:
        """One forward over every running request (each holds a block for its next row)."""
        prefilling = [r for r in self.places.running if r.prefilling]
        price = self.price.with_table(self.costs.table)
        decoding = [r for r in self.places.running if not r.prefilling]
        decoding = self.shares.turns(
            decoding, prefilling, lambda r: pending_cost(r, price, self.host), price.fixed_s
        )
        self._steps += 1
        for req in decoding:
            req.turn = self._steps
        rows: list[_Row] = []
        seqs: list[SeqStep] = []
        budget = max(self.token_budget - len(decoding), 1)
        self._add_chunks(prefilling, budget, price, rows, seqs)
        self._add_drafts(decoding, price, rows, seqs)
        if seqs:
            forward_rows = sum(len(s.tokens) for s in seqs)
            logits, seconds = self._forward(seqs, forward_rows)
            self._deliver(rows, seqs, logits)
            if self.clock is not None:  # the head's chunks run as _deliver reads them
                head = logits.head_seconds if isinstance(logits, ChunkedLogits) else 0.0
                self._timed(forward_rows, seconds + head)
        self.host.end_step()

    def _add_chunks(
        self,
        prefilling: list[Request],
        budget: int,
        price: RowPrice,
        rows: list[_Row],
        seqs: list[SeqStep],
    ) -> None:
        """Prompt chunks of the requests in prefill, ``budget`` rows shared by the tenants,
        each tenant's chunks within its share of the step's cost (``price``) beside another
        tenant's decode rows or prompt's end (``StepShares.prompt_allowances``), at least
        one row a step."""
        wants: dict[str, int] = {}
        weights: dict[str, float] = {}
        for req in prefilling:
            wants[req.owner] = wants.get(req.owner, 0) + req.to_fill - req.computed
        for req in self.places.running:
            weights[req.owner] = req.weight
        grants = split(budget, wants, weights, self._prefill_credit, self._prefill_caps(weights))
        finishing: dict[str, float] = {}  # tenants whose prompts all end in this step
        for req in prefilling:
            if wants[req.owner] <= grants[req.owner]:
                rest = price.seq(req.to_fill - req.computed, req.to_fill)
                finishing[req.owner] = finishing.get(req.owner, 0.0) + rest
        seconds = self.shares.prompt_allowances(grants, finishing)
        chunked: set[str] = set()
        for req in prefilling:
            grant = grants[req.owner]
            if grant <= 0:
                continue
            end = min(req.to_fill, req.computed + grant)
            left = seconds[req.owner]
            if left is not None:
                fits = price.chunk_rows(req.computed, end - req.computed, left)
                end = req.computed + max(fits, 0 if req.owner in chunked else 1)
                if end == req.computed:
                    continue
                seconds[req.owner] = left - price.seq(end - req.computed, end)
            grants[req.owner] -= end - req.computed
            chunked.add(req.owner)
            chunk = self._isolated(req, self._chunk, req, end)
            if chunk is not None:
                seqs.append(chunk)
                rows.append(_Row(req, None))

    def _add_drafts(
        self,
        decoding: list[Request],
        price: RowPrice,
        rows: list[_Row],
        seqs: list[SeqStep],
    ) -> None:
        """Each decoding request's pending token and its draft, planned over the batch."""
        began = time.perf_counter()
        base_rows = len(decoding) + sum(len(s.tokens) for s in seqs)
        proposals = [(r, self._hosted(r, self._propose, r)) for r in decoding]
        proposed = [d for _, d in proposals if d is not None]
        decoding = [r for r, d in proposals if d is not None]
        emitting = Counter(
            r.request.owner for r, s in zip(rows, seqs, strict=True) if s.logits == "last"
        )

        def plan(owner: str, drafts: list[Draft]) -> list[Draft]:
            mine = [r for r in decoding if r.owner == owner]
            probs = [r.calibration.probs(d) for r, d in zip(mine, drafts, strict=True)]
            extra = [_host_seconds_per_row(r) for r in mine]
            return plan_batch(drafts, base_rows, self.costs.table, probs, emitting[owner], extra)

        weights = {r.owner: r.weight for r in decoding}
        caps = self._shares(weights) if len(weights) > 1 else {}
        room = len(self.costs.table) - 1 - base_rows  # the rows the step costs are known for
        drafts = fair_plan(decoding, proposed, plan, self.shares, price, self.host, caps, room)
        drafted = time.perf_counter()
        for req, draft in zip(decoding, drafts, strict=True):
            req.stats.draft_s += drafted - began
            fits = self.places.room(req, req.computed + 1 + len(draft)) - req.computed - 1
            if fits < len(draft):  # the pool is short: the draft, never the answer, is cut
                draft = draft.subset(list(range(fits)))
            verify = self._isolated(req, self._verify_rows, req, draft)
            if verify is not None:
                seqs.append(verify)
                rows.append(_Row(req, draft))

    def _forward(self, seqs: list[SeqStep], rows: int) -> tuple[Sequence[torch.Tensor], float]:
        """The model's step over ``seqs`` (at most ``LOGIT_ROWS`` rows of logits held at a
        time) and its seconds by ``clock`` (0 without one)."""
        clock = self.clock
        if self.threads is not None:
            table = self.costs.table
            self.threads.apply(table[rows] / table[1] if rows < len(table) else math.inf)
        forward = 0.0 if clock is None else clock()
        logits = self.model.step_chunked(seqs, self.pool.storage, LOGIT_ROWS)
        return logits, 0.0 if clock is None else clock() - forward

    def _deliver(
        self, rows: list[_Row], seqs: list[SeqStep], logits: Sequence[torch.Tensor]
    ) -> None:
        """Verify each row's logits and emit what it commits."""
        verdicts = _greedy_verdicts(rows, logits)
        if len(logits) != len(rows):
            raise ValueError(f"{len(logits)} sequences of logits for {len(rows)} rows")
        # each sequence's logits read by index and let go before the next is read (not
        # zipped: zip's reused tuple would hold them), so that a chunk of them is freed
        # before the next one is computed
        for i, (row, seq, verdict) in enumerate(zip(rows, seqs, verdicts, strict=True)):
            out = logits[i]
            if row.draft is None:
                self._isolated(
                    row.request, self._after_chunk, row.request, len(seq.tokens), out, verdict
                )
            else:
                self._hosted(row.request, self._after_verify, row.request, row.draft, out, verdict)
            del out

    def _prefill_caps(self, weights: dict[str, float]) -> dict[str, int] | None:
        """With several tenants running, each one's prompt rows in a step at most its weighted
        share of the token budget: what a tenant that is only decoding leaves is not given
        to another's prefill, so one tenant's long prompts or recomputation cannot make the
        others' decode steps slow (None: one tenant, who may use the whole budget).
        ``weights``: every running tenant's."""
        return self._shares(weights) if len(weights) > 1 else None

    def _shares(self, weights: dict[str, float]) -> dict[str, int]:
        """Each tenant's weighted share of the token budget (at least one row)."""
        total = sum(weights.values())
        return {o: max(int(self.token_budget * w / total), 1) for o, w in weights.items()}

    def _isolated(self, req: Request, stage: Callable[..., _T], *args: object) -> _T | None:
        """``stage(*args)`` for ``req``; if it raises, only ``req`` ends (None)."""
        try:
            return stage(*args)
        except Exception as exc:  # one request's failure ends only that request
            self.places.finish(req, exc)
            return None

    def _hosted(self, req: Request, stage: Callable[..., _T], *args: object) -> _T | None:
        """``_isolated(req, stage, *args)``, its seconds by ``clock`` counted as ``req``'s
        host time."""
        clock = self.clock
        if clock is None:
            return self._isolated(req, stage, *args)
        began = clock()
        try:
            return self._isolated(req, stage, *args)
        finally:
            self.host.add(req, clock() - began)

    def _timed(self, rows: int, seconds: float) -> None:
        """Feed a forward's time to the thread choice and (on the chosen count) the costs."""
        table = self.costs.table
        ratio = seconds / table[rows] if rows < len(table) else 0.0
        if self.threads is None or self.threads.observe(ratio):
            self.costs.observe(rows, seconds)

    def _checked(self, tokens: list[int]) -> torch.Tensor:
        """``tokens`` as a tensor; a ``ValueError`` for an id past the embedding's rows
        (which would fail the whole forward)."""
        ids = torch.tensor(tokens, dtype=torch.long)
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.numel():
            raise ValueError(f"token id {int(bad[0])} is past the model's {self.vocab_size} ids")
        return ids

    def _chunk(self, req: Request, end: int) -> SeqStep:
        assert req.table is not None
        start = req.computed
        last = end == req.to_fill and req.pending is None  # a resumed one emits nothing
        return SeqStep(
            tokens=self._checked(req.tokens[start:end]),
            positions=torch.arange(start, end),
            new_slots=req.table.slots(start, end),
            context_slots=req.table.slots(0, start),
            logits="last" if last else "none",
        )

    def _propose(self, req: Request) -> Draft:
        if req.drafter is None or req.controller is None or req.calibration.resting:
            return Draft.empty()
        limit, width = req.controller.budget()
        limit = min(limit, req.max_draft, req.max_new - req.produced - 1)
        if limit <= 0:
            return Draft.empty()
        draft = req.drafter.propose(limit, width)
        try:
            draft.check(self.vocab_size)
        except ValueError as exc:  # a drafter bug costs the speed-up, never the answer
            log.warning("draft dropped: %s", exc)
            return Draft.empty()
        # the first nodes are closed under parents (parents precede children)
        draft = draft if len(draft) <= limit else draft.subset(list(range(limit)))
        return draft if req.grammar is None else req.grammar.prune(draft)

    def _verify_rows(self, req: Request, draft: Draft) -> SeqStep:
        assert req.table is not None and req.pending is not None
        start = req.computed
        k = len(draft)
        depths = torch.as_tensor(draft.depths(), dtype=torch.long)
        return SeqStep(
            tokens=self._checked([req.pending, *draft.tokens.tolist()]),
            positions=start + torch.cat([torch.zeros(1, dtype=torch.long), depths]),
            new_slots=req.table.slots(start, start + 1 + k),
            context_slots=req.table.slots(0, start),
            mask=None if draft.is_chain else tree_mask(draft.parents),
        )

    def _after_chunk(
        self, req: Request, n: int, logits: torch.Tensor, verdict: Verdict | None = None
    ) -> None:
        """``verdict``: the emitting chunk's, where ``_greedy_verdicts`` found it."""
        req.computed += n
        self.places.publish(req)
        if req.prefilling or req.pending is not None:  # more to fill, or resumed: decodes next
            return
        req.stats.prefill_s = time.perf_counter() - req.started
        self.places.release_followers(req)
        if verdict is None:
            verdict = self._verdict(req, logits, Draft.empty())
        new = [verdict.next_token]
        self._emit(req, new, self._logprobs(req, logits, new, verdict))

    def _after_verify(
        self, req: Request, draft: Draft, logits: torch.Tensor, verdict: Verdict | None = None
    ) -> None:
        """``verdict``: the draft's, where ``_greedy_verdicts`` found it."""
        assert req.table is not None
        if verdict is None:
            verdict = self._verdict(req, logits, draft)
        accepted = len(verdict.accepted)
        if not draft.is_chain and accepted:
            self._compact(req.table, req.computed, draft, verdict.accepted)
        req.computed += 1 + accepted
        req.stats.count(len(draft), accepted)
        req.stats.count_sources(draft.source.tolist(), draft.source[verdict.accepted].tolist())
        req.calibration.observe(draft, accepted)
        if req.controller is not None:
            req.controller.observe(len(draft), accepted)
        new = [int(draft.tokens[n]) for n in verdict.accepted] + [verdict.next_token]
        self._emit(req, new, self._logprobs(req, logits, new, verdict))

    def _verdict(self, req: Request, logits: torch.Tensor, draft: Draft) -> Verdict:
        if req.penalties.active:
            if req.adjuster is None:
                req.adjuster = PenaltyState(
                    req.penalties, req.tokens, len(req.prompt_ids), logits.shape[-1], logits.device
                )
            logits = req.adjuster.rows(logits, draft.tokens.tolist(), draft.parents.tolist())
        rows: RowProbs = logits
        if req.grammar is not None:
            rows = req.grammar.rows(logits, draft.tokens.tolist(), draft.parents.tolist())
        try:
            if req.params.greedy:
                return verify_greedy(rows, draft.tokens, draft.parents)
            probs = _LazyProbs(rows, req.params)
            return verify_sampled(probs, draft.tokens, draft.parents, req.generator, sample)  # type: ignore[arg-type]
        except DraftRowOverLimit as over:
            # A row is read once its node is accepted: plain decoding reaches that node too
            # and the step ends with its token (the target's own after its parent's row,
            # whose draw is made); committing the path in ``_emit`` fails where plain
            # decoding fails on it, unless the answer ends before.
            path = _path_to(draft, over.row - 1)
            return Verdict(path[:-1], int(draft.tokens[path[-1]]))

    def _logprobs(
        self, req: Request, logits: torch.Tensor, new: list[int], verdict: Verdict
    ) -> list[TokenLogprob] | None:
        """The emitted tokens' logprobs (row 0 emits the first, node n's row the next)."""
        if req.logprobs is None:
            return None
        rows = [0, *(n + 1 for n in verdict.accepted)]
        return token_logprobs(logits, rows, new, req.logprobs)

    def _compact(self, table: BlockTable, start: int, draft: Draft, path: list[int]) -> None:
        """Move the accepted tree nodes' K/V to the positions right after the root."""
        src = table.slots(start, start + 1 + len(draft))[torch.tensor(path) + 1]
        dst = table.slots(start + 1, start + 1 + len(path))
        self.pool.storage.copy_slots(dst, src)

    def _emit(
        self, req: Request, new: list[int], logprobs: list[TokenLogprob] | None = None
    ) -> None:
        over: GrammarLimitExceeded | None = None
        if req.grammar is not None:
            before = req.grammar.committed
            over = req.grammar.commit(new)
            if over is not None:  # plain decoding emits the tokens before it, then fails
                new = new[: req.grammar.committed - before]
        req.tokens += new
        if over is not None:  # the K/V past the emitted tokens is not theirs
            req.computed = min(req.computed, len(req.tokens) - 1)
        if req.adjuster is not None:
            req.adjuster.commit(new)
        self.places.publish(req)
        req.produced += len(new)
        req.pending = new[-1] if new else req.pending
        delta = req.output.push(new)
        if logprobs is not None:
            delta = dataclasses.replace(delta, logprobs=logprobs[: len(delta.token_ids)])
        if delta.token_ids or delta.text:
            req.on_delta(delta)
        if req.output.finish_reason is None and req.produced < req.max_new:
            if over is not None:  # unless the tokens before it ended the answer
                self.places.finish(req, over)
                return
            if req.drafter is not None:
                began = time.perf_counter()
                req.drafter.extend(new)
                req.stats.draft_s += time.perf_counter() - began
            return
        tail = req.output.finish()
        if tail.text:
            req.on_delta(tail)
        self.places.finish(req)


def _host_seconds_per_row(req: Request) -> float:
    """Host time one more row of ``req`` costs besides the forward: its penalties, and
    detokenizing and stop-checking the token it commits."""
    penalties = 0.0 if req.adjuster is None else req.adjuster.seconds_per_row
    return penalties + req.output.seconds_per_token


def _greedy_verdicts(rows: list[_Row], logits: Sequence[torch.Tensor]) -> list[Verdict | None]:
    """Per row of a step, its verdict where it is greedy on the raw logits (no penalties,
    no grammar) and emits, found for all of them at once on the logits' device with one
    copy to the host (where ``_on_device`` says so); None for the others, whose
    ``_verdict`` reads their rows."""
    verdicts: list[Verdict | None] = [None] * len(rows)
    if not logits or not _on_device(logits[0].device):
        return verdicts
    picked = [
        i
        for i, (row, out) in enumerate(zip(rows, logits, strict=True))
        if out.shape[0]
        and row.request.params.greedy
        and not row.request.penalties.active
        and row.request.grammar is None
    ]
    drafts = [rows[i].draft or Draft.empty() for i in picked]  # None: a prompt chunk
    found = verify_greedy_batch(
        [logits[i] for i in picked], [(d.tokens, d.parents) for d in drafts]
    )
    for i, verdict in zip(picked, found, strict=True):
        verdicts[i] = verdict
    return verdicts


def _path_to(draft: Draft, node: int) -> list[int]:
    """The draft nodes from the root's child down to ``node``."""
    path: list[int] = []
    while node >= 0:
        path.append(node)
        node = int(draft.parents[node])
    return path[::-1]


def _on_device(device: torch.device) -> bool:
    """Whether a step's greedy verdicts are found on ``device`` (``verify_greedy_batch``):
    where each row read to the host would wait for the device. On the CPU no read waits,
    and ``verify_greedy`` reads only the accepted path's rows, fewer than every row's
    argmax."""
    return device.type != "cpu"


class _LazyProbs:
    """Row i of the target's distributions, computed (one row at a time) when asked for."""

    def __init__(self, logits: RowProbs, params: SamplingParams) -> None:
        self.logits = logits
        self.params = params

    def __getitem__(self, row: int) -> torch.Tensor:
        return target_probs(self.logits[row], self.params)
