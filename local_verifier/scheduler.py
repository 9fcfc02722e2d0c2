"""Continuous batching: every step runs one ``Transformer.step`` over all active requests.

Each step carries, for every decoding request, its pending token plus the draft chosen for
it (chain or tree), and prompt chunks of requests still in prefill, up to a token budget
per step that tenants share by weight. Requests join (when the pool has blocks for their
prompt; tenants take turns by deficit round robin, ``fair_queue``) and leave between
steps; a cancelled request's blocks go back to the pool at the next step. With the batch
full, a tenant waiting below its weighted share of the batch's places takes one from the
tenant furthest above its share, whose latest request is preempted.

KV blocks are taken as tokens are committed. When the pool runs out, the request of the
lowest-weight tenant that arrived last is preempted: its blocks are freed and it waits
first in its tenant's line to recompute its K/V (from the prefix cache where its blocks
still are) and go on where it stopped. A row's K/V and logits do not depend on what else
shares its forward pass or on how its prompt was chunked, so the resumed answer is the
uninterrupted one, bit for bit.

Only the scheduler's thread touches the pool, the model and the requests' state.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import torch

from local_verifier.devices import ThreadTuner
from local_verifier.fair_queue import FairQueue, decode_turns, split
from local_verifier.grammar import Constraint, DraftRowOverLimit, GrammarLimitExceeded
from local_verifier.kv_pool import (
    BlockTable,
    KVPool,
    PoolExhausted,
    block_keys,
    chain_key,
    root_key,
)
from local_verifier.logits_processors import Penalties, PenaltyState
from local_verifier.logprobs import TokenLogprob, token_logprobs
from local_verifier.model import SeqStep, Transformer
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.sampling import SamplingParams, sample, target_probs
from local_verifier.step_costs import LiveCosts
from local_verifier.tokenizer import Tokenizer
from local_verifier.tree import tree_mask
from local_verifier.verify import (
    RowProbs,
    Verdict,
    verify_greedy,
    verify_greedy_batch,
    verify_sampled,
)
from lookup.controller import ScoreCalibration, plan_batch
from lookup.draft import Draft, Source

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class DraftSource(Protocol):
    """What a request needs from a drafter (``lookup.drafter.Drafter`` or a test's own)."""

    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft: ...


class DraftPolicy(Protocol):
    """What a request needs from a controller (``lookup.controller.DraftController``)."""

    def budget(self) -> tuple[int, int]: ...

    def observe(self, drafted: int, accepted: int) -> None: ...


@dataclass
class Stats:
    """Counters of one request, filled in as it runs."""

    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # Source names, lower case
    drafted_by_source: dict[str, int] = field(default_factory=dict)  # verified draft nodes
    queued_s: float = 0.0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    preemptions: int = 0  # times its blocks were taken back and its K/V recomputed

    def count(self, drafted: int, accepted: int) -> None:
        self.verify_steps += 1
        self.drafted_tokens += drafted
        self.accepted_tokens += accepted
        if accepted > len(self.accepted_by_position):
            self.accepted_by_position += [0] * (accepted - len(self.accepted_by_position))
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def count_sources(self, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        """Count verified and accepted draft tokens by the ``lookup.draft.Source`` they were
        copied from."""
        for counts, sources in (
            (self.drafted_by_source, drafted),
            (self.accepted_by_source, accepted),
        ):
            for source in sources:
                name = Source(source).name.lower()
                counts[name] = counts.get(name, 0) + 1


@dataclass(eq=False)
class Request:
    """One admitted or waiting generation and its state between steps."""

    prompt_ids: list[int]
    max_new: int
    params: SamplingParams
    generator: torch.Generator | None
    drafter: DraftSource | None
    controller: DraftPolicy | None
    max_draft: int
    output: OutputAssembler
    on_delta: Callable[[TextDelta], None]
    on_finish: Callable[[Request, Exception | None], None]  # error None: done or cancelled
    tenant: str = ""  # whose prefix cache the request reads and fills
    owner: str = ""  # the tenant whose share of the engine the request uses
    weight: float = 1.0  # the owner's weight in fair scheduling
    penalties: Penalties = field(default_factory=Penalties)
    adjuster: PenaltyState | None = None  # the penalties' tensors, built at the first verdict
    logprobs: int | None = None  # None: none reported; else how many top alternatives
    followers: list[Request] = field(default_factory=list)  # admitted once our prompt is in
    grammar: Constraint | None = None  # structured output: masks rows, prunes drafts
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    table: BlockTable | None = None
    computed: int = 0  # positions whose K/V is in the pool (committed)
    cached_tokens: int = 0  # prompt positions found in the prefix cache
    tokens: list[int] = field(default_factory=list)  # prompt and output so far
    keys: list[bytes] = field(default_factory=list)  # prefix keys of the table's full blocks
    pending: int | None = None  # the last emitted token, not yet in the pool
    produced: int = 0
    cancelled: bool = False
    stats: Stats = field(default_factory=Stats)
    turn: int = 0  # the step it last decoded in (``decode_turns``)
    calibration: ScoreCalibration = field(default_factory=ScoreCalibration)

    @property
    def to_fill(self) -> int:
        """Positions whose K/V must be in the pool before the request decodes: its prompt,
        or after a preemption every token but the pending one."""
        return len(self.tokens) - (self.pending is not None)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.to_fill

    def priority(self) -> tuple[float, float]:
        """Preempted first when largest: the lowest weight, then the latest submitted."""
        return (-self.weight, self.submitted)


@dataclass
class _Row:
    """What one sequence contributed to a step."""

    request: Request
    draft: Draft | None  # None: a prompt chunk


class Scheduler:
    """Admits, batches and advances requests, one ``Transformer.step`` per call of ``step``."""

    def __init__(
        self,
        model: Transformer,
        pool: KVPool,
        tokenizer: Tokenizer,
        row_costs: Sequence[float],
        token_budget: int = 256,
        max_batch: int = 16,
        prefix_cache: bool = True,
        clock: Callable[[], float] | None = time.perf_counter,
        threads: ThreadTuner | None = None,
    ) -> None:
        """``row_costs[r]``: the start-up measured seconds of a step of r rows; the draft plan
        uses them as kept up to date by the forwards run, timed with ``clock`` (None: as
        given, never updated). ``threads``: chooses the CPU thread count from the timed
        forwards (needs ``clock``)."""
        self.model = model
        self.pool = pool
        self.tokenizer = tokenizer
        self.costs = LiveCosts(row_costs)
        self.clock = clock
        self.threads = threads if clock is not None else None
        self.token_budget = token_budget
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.hit_tokens = 0  # prompt tokens found in the prefix cache
        self.miss_tokens = 0  # prompt tokens computed
        self.vocab_size = model.config.vocab_size
        self.waiting: FairQueue[Request] = FairQueue()
        self.preemptions = 0  # requests whose blocks were taken back to let others run
        self.running: list[Request] = []
        self._steps = 0  # steps run, for ``Request.turn``
        self._prefill_credit: dict[str, float] = {}  # tenants' carried prefill shares
        self._claimed: tuple[list[bytes], list[int]] = ([], [])  # the admitted one's prefix

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- between steps ----------------------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for req in [r for r in self.running if r.cancelled]:
            self._finish(req)
        for req in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(req)
            self._finish(req)

    def _fits(self, req: Request, among: frozenset[str] | None = None) -> bool:
        """Whether the pool has room for ``req``'s prompt (or, resumed, its tokens) and
        then one more block for each running request (its cached prefix blocks claimed);
        False for a tenant not ``among`` those given."""
        if among is not None and req.owner not in among:
            return False
        bs = self.pool.block_size
        keys: list[bytes] = []
        hits: list[int] = []
        if self.prefix_cache:  # until decoding, the last token is computed (its logits)
            cacheable = req.tokens[:-1] if req.pending is not None else req.prompt_ids[:-1]
            keys = block_keys(req.tenant, cacheable, bs)
            hits = self.pool.lookup(keys)
        if -(-_fill(req) // bs) - len(hits) + len(self.running) > self.pool.available():
            self.pool.release(hits)
            return False
        self._claimed = (keys, hits)
        return True

    def _admit(self) -> None:
        while len(self.running) < self.max_batch:
            head = self.waiting.pop(self._fits)
            if head is None:
                return
            self._start(head)
        self._rebalance()

    def _rebalance(self) -> None:
        """With the batch full, a tenant waiting below its weighted share of the batch's
        places takes one from the tenant furthest above its share (that tenant's latest
        request is preempted), until no tenant waits below its share."""
        while self.waiting and len(self.running) >= self.max_batch:
            running = Counter(r.owner for r in self.running)
            weights = {r.owner: r.weight for r in (*self.running, *self.waiting)}
            total = sum(weights.values())
            share = {o: self.max_batch * w / total for o, w in weights.items()}
            starved = {o for o in self.waiting.owners() if running[o] + 1 <= share[o]}
            over = max(running, key=lambda o: running[o] - share[o])
            if not starved or running[over] - 1 < share[over]:
                return
            victim = max((r for r in self.running if r.owner == over), key=Request.priority)
            assert victim.table is not None
            freed = self.pool.available() + len(victim.table.blocks)
            bs = self.pool.block_size
            if all(-(-_fill(self.waiting.first(o)) // bs) > freed for o in starved):
                return  # no starved request would fit even then: nothing to preempt for
            self._preempt(victim)
            head = self.waiting.pop(functools.partial(self._fits, among=frozenset(starved)))
            if head is None:
                return
            self._start(head)

    def _start(self, head: Request) -> None:
        """Run ``head``: its table holds the prefix blocks ``_fits`` claimed and its prompt's."""
        keys, hits = self._claimed
        bs = self.pool.block_size
        head.table = BlockTable(self.pool)
        head.table.blocks = list(hits)
        head.keys = keys[: len(hits)]
        head.computed = len(hits) * bs
        if not head.tokens:  # first admission (a preempted request has its tokens)
            head.tokens = list(head.prompt_ids)
            head.cached_tokens = head.computed
            self.hit_tokens += head.cached_tokens
            self.miss_tokens += len(head.prompt_ids) - head.cached_tokens
            head.started = time.perf_counter()
            head.stats.queued_s = head.started - head.submitted
        head.table.reserve(head.to_fill)
        self.running.append(head)

    def _grow(self) -> None:
        """Give every running request a block for its next row, highest priority first;
        when the pool is out, preempt the lowest-priority running request (which may be
        the one asking) until there is one."""
        for req in sorted(self.running, key=Request.priority):
            while req in self.running:
                assert req.table is not None
                try:
                    req.table.reserve(req.computed + 1)
                    break
                except PoolExhausted:
                    self._preempt(max(self.running, key=Request.priority))

    def _preempt(self, req: Request) -> None:
        """Free ``req``'s blocks; it waits first in its tenant's line to recompute them."""
        assert req.table is not None
        self.running.remove(req)
        req.table.release()
        req.table = None
        req.keys = []
        req.computed = 0
        self.preemptions += 1
        req.stats.preemptions += 1
        self.waiting.append(req, front=True)

    def _room(self, req: Request, end: int) -> int:
        """Reserve blocks for ``req``'s positions up to ``end`` as far as the pool allows
        without preempting; the end reserved."""
        assert req.table is not None
        bs = self.pool.block_size
        end = min(end, (len(req.table.blocks) + self.pool.available()) * bs)
        req.table.reserve(end)
        return end

    def _finish(self, req: Request, error: Exception | None = None) -> None:
        """Release the request's blocks and tell its owner it is over."""
        if req in self.running:
            self.running.remove(req)
        if req.table is not None:
            req.table.release()
            req.table = None
        if error is None:
            self._release_followers(req)
        for follower in req.followers:  # a failed forward fails the siblings too
            self._finish(follower, error)
        req.on_finish(req, error)

    def _release_followers(self, req: Request) -> None:
        """Queue ``req``'s followers first in its tenant's line (its prompt blocks are
        published now); other tenants' turns come as before."""
        for follower in reversed(req.followers):
            self.waiting.append(follower, front=True)
        req.followers = []

    def fail_all(self, error: Exception) -> None:
        """End every request (a forward failed): each owner gets ``error``."""
        for req in [*self.running, *self.waiting]:
            self._finish(req, error)
        self.waiting.clear()

    # -- one step -------------------------------------------------------------------------

    def step(self) -> None:
        """Admit what fits, run one forward over every active request, deliver the output."""
        self._drop_cancelled()
        self._admit()
        self._grow()
        if not self.running:
            return
        prefilling = [r for r in self.running if r.prefilling]
        decoding = decode_turns([r for r in self.running if not r.prefilling], prefilling)
        self._steps += 1
        for req in decoding:
            req.turn = self._steps
        budget = max(self.token_budget - len(decoding), 1)
        rows: list[_Row] = []
        seqs: list[SeqStep] = []
        wants: dict[str, int] = {}
        weights: dict[str, float] = {}
        for req in prefilling:
            wants[req.owner] = wants.get(req.owner, 0) + req.to_fill - req.computed
        for req in self.running:
            weights[req.owner] = req.weight
        grants = split(budget, wants, weights, self._prefill_credit, self._prefill_caps(weights))
        for req in prefilling:
            grant = grants[req.owner]
            if grant <= 0:
                continue
            end = min(req.to_fill, req.computed + grant)
            grants[req.owner] -= end - req.computed
            chunk = self._isolated(req, self._chunk, req, end)
            if chunk is not None:
                seqs.append(chunk)
                rows.append(_Row(req, None))
        began = time.perf_counter()
        base_rows = len(decoding) + sum(len(s.tokens) for s in seqs)
        proposals = [(r, self._isolated(r, self._propose, r)) for r in decoding]
        proposed = [d for _, d in proposals if d is not None]
        decoding = [r for r, d in proposals if d is not None]
        drafts = plan_batch(
            proposed,
            base_rows,
            self.costs.table,
            [r.calibration.probs(d) for r, d in zip(decoding, proposed, strict=True)],
            sum(s.logits == "last" for s in seqs),
            [_host_seconds_per_row(r) for r in decoding],
        )
        drafts = self._fair_drafts(decoding, drafts)
        drafted = time.perf_counter()
        for req, draft in zip(decoding, drafts, strict=True):
            req.stats.draft_s += drafted - began
            fits = self._room(req, req.computed + 1 + len(draft)) - req.computed - 1
            if fits < len(draft):  # the pool is short: the draft, never the answer, is cut
                draft = draft.subset(list(range(fits)))
            verify = self._isolated(req, self._verify_rows, req, draft)
            if verify is not None:
                seqs.append(verify)
                rows.append(_Row(req, draft))
        if not seqs:
            return
        clock = self.clock
        if self.threads is not None:
            self.threads.apply()
        forward = 0.0 if clock is None else clock()
        logits = self.model.step(seqs, self.pool.storage)
        if clock is not None:
            self._timed(sum(len(s.tokens) for s in seqs), clock() - forward)
        verdicts = _greedy_verdicts(rows, logits)
        for row, seq, out, verdict in zip(rows, seqs, logits, verdicts, strict=True):
            try:
                if row.draft is None:
                    self._after_chunk(row.request, len(seq.tokens), out, verdict)
                else:
                    self._after_verify(row.request, row.draft, out, verdict)
            except Exception as exc:  # one request's failure ends only that request
                self._finish(row.request, exc)

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

    def _fair_drafts(self, decoding: list[Request], drafts: list[Draft]) -> list[Draft]:
        """With several tenants decoding, each one's draft rows within its weighted share
        of the step's token budget: one tenant's long drafts cannot make everyone's step
        slow (a cut draft costs speed, never the answer)."""
        weights = {r.owner: r.weight for r in decoding}
        if len(weights) < 2:
            return drafts
        left = self._shares(weights)
        out = []
        for req, draft in zip(decoding, drafts, strict=True):
            k = min(len(draft), left[req.owner])
            left[req.owner] -= k
            out.append(draft if k == len(draft) else draft.subset(list(range(k))))
        return out

    def _isolated(self, req: Request, stage: Callable[..., _T], *args: object) -> _T | None:
        """``stage(*args)`` for ``req``; if it raises, only ``req`` ends (None)."""
        try:
            return stage(*args)
        except Exception as exc:  # one request's failure ends only that request
            self._finish(req, exc)
            return None

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

    def _publish(self, req: Request) -> None:
        """Index the request's newly committed full blocks (draft rows never are)."""
        if not self.prefix_cache or req.table is None:
            return
        bs = self.pool.block_size
        while (len(req.keys) + 1) * bs <= req.computed:
            i = len(req.keys)
            parent = req.keys[-1] if req.keys else root_key(req.tenant)
            req.keys.append(chain_key(parent, req.tokens[i * bs : (i + 1) * bs]))
            self.pool.publish(req.table.blocks[i], req.keys[-1])

    def _after_chunk(
        self, req: Request, n: int, logits: torch.Tensor, verdict: Verdict | None = None
    ) -> None:
        """``verdict``: the emitting chunk's, where ``_greedy_verdicts`` found it."""
        req.computed += n
        self._publish(req)
        if req.prefilling or req.pending is not None:  # more to fill, or resumed: decodes next
            return
        req.stats.prefill_s = time.perf_counter() - req.started
        self._release_followers(req)
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
        self._publish(req)
        req.produced += len(new)
        req.pending = new[-1] if new else req.pending
        delta = req.output.push(new)
        if logprobs is not None:
            delta = dataclasses.replace(delta, logprobs=logprobs[: len(delta.token_ids)])
        if delta.token_ids or delta.text:
            req.on_delta(delta)
        if req.output.finish_reason is None and req.produced < req.max_new:
            if over is not None:  # unless the tokens before it ended the answer
                self._finish(req, over)
                return
            if req.drafter is not None:
                began = time.perf_counter()
                req.drafter.extend(new)
                req.stats.draft_s += time.perf_counter() - began
            return
        tail = req.output.finish()
        if tail.text:
            req.on_delta(tail)
        self._finish(req)


def _host_seconds_per_row(req: Request) -> float:
    """Host time one more row of ``req`` costs besides the forward: its penalties, and
    detokenizing and stop-checking the token it commits."""
    penalties = 0.0 if req.adjuster is None else req.adjuster.seconds_per_row
    return penalties + req.output.seconds_per_token


def _greedy_verdicts(rows: list[_Row], logits: list[torch.Tensor]) -> list[Verdict | None]:
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


def _fill(req: Request) -> int:
    """Positions ``req`` fills once admitted: its prompt, or resumed, its tokens so far."""
    return req.to_fill if req.tokens else len(req.prompt_ids)


class _LazyProbs:
    """Row i of the target's distributions, computed (one row at a time) when asked for."""

    def __init__(self, logits: RowProbs, params: SamplingParams) -> None:
        self.logits = logits
        self.params = params

    def __getitem__(self, row: int) -> torch.Tensor:
        return target_probs(self.logits[row], self.params)
