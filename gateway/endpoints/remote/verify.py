"""Greedy verification of the gateway's drafts over an engine's own API.

A round sends the committed tokens plus a draft chain and reads the engine's top-1 at
every draft position and after the draft (one request, :meth:`EngineClient.score`): the
longest prefix of draft tokens equal to the engine's top-1 is accepted, plus the engine's
token at the first mismatch (or the next token when all were accepted). That is what
greedy decoding would have produced, provided scoring and decoding agree; the self-test
measures whether they do.

Left to the engine's own decoding (:meth:`EngineClient.decode`): a position whose top-1
leads the runner-up by less than ``near_tie`` (where the two passes could round apart),
and every stretch where drafting does not pay. Whether it pays is the cost model of
``lookup.controller.DraftController`` with a plain step costing the measured time per
output token of the engine's decoding and a verify round costing the measured round trip.
A round trip that fails continues as the engine's plain decoding from the committed
tokens; only when that fails too does the failure reach the caller.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field

from gateway.endpoints.remote.context import TokenIds
from gateway.endpoints.remote.failures import RemoteFailure
from gateway.endpoints.remote.wire import Ask, EngineClient
from lookup.controller import DraftController
from lookup.draft import Draft
from lookup.drafter import Drafter

NEAR_TIE = 1e-3
"""Top-1 minus top-2 logprob below which the engine decodes the token itself."""
MAX_DRAFT = 16
DECODE_CHUNK = 8  # tokens decoded plainly before drafting is considered again
EMA = 0.8


@dataclass
class Pacing:
    """An endpoint's costs in seconds: measured (exponential moving averages), or pinned
    by the operator (``verify_round_trip_s``/``verify_token_s``), then never changed."""

    round_trip_s: float = 0.05  # one scoring request
    token_s: float = 0.02  # one output token of the engine's plain streamed decoding
    pinned_round_trip: bool = False
    pinned_token: bool = False

    @staticmethod
    def configured(round_trip_s: float | None, token_s: float | None) -> Pacing:
        pacing = Pacing(
            pinned_round_trip=round_trip_s is not None, pinned_token=token_s is not None
        )
        pacing.round_trip_s = round_trip_s or pacing.round_trip_s
        pacing.token_s = token_s or pacing.token_s
        return pacing

    measured_round_trips: int = 0
    measured_decodes: int = 0

    def remeasure(self) -> None:
        """Let the next measurements replace the estimates rather than blend into them (a
        self-test measures afresh)."""
        self.measured_round_trips = self.measured_decodes = 0

    def note_round_trip(self, seconds: float) -> None:
        """One scoring request's time (the first replaces the seed value)."""
        if not self.pinned_round_trip:
            keep = EMA if self.measured_round_trips else 0.0
            self.round_trip_s = keep * self.round_trip_s + (1 - keep) * seconds
            self.measured_round_trips += 1

    def note_decode(self, seconds: float, tokens: int) -> None:
        """A plain decoding request's time and tokens (the first replaces the seed value)."""
        if tokens > 0 and not self.pinned_token:
            keep = EMA if self.measured_decodes else 0.0
            self.token_s = keep * self.token_s + (1 - keep) * seconds / tokens
            self.measured_decodes += 1

    def controller(self, max_draft: int = MAX_DRAFT) -> DraftController:
        """c(0): a plain decoded token; c(k >= 1): one round trip (the cached prefix is not
        recomputed; the draft's rows cost little next to the trip on a GPU server)."""
        costs = [max(self.token_s, 1e-6)] + [max(self.round_trip_s, 1e-6)] * max_draft
        return DraftController(costs, max_width=1)

    def pays(self, expected_tokens: float) -> bool:
        """Whether rounds committing ``expected_tokens`` each beat plain decoding."""
        return expected_tokens * self.token_s > self.round_trip_s


@dataclass
class LoopStats:
    """What one answer's verification did."""

    rounds: int = 0  # scoring rounds
    score_requests: int = 0  # their HTTP requests (a vLLM round whose draft was cached: 2)
    decodes: int = 0  # plain decoding requests (no draft worth it, near ties, recovery)
    drafted: int = 0
    accepted: int = 0
    near_ties: int = 0
    recovered: int = 0  # failed round trips continued by plain decoding
    accepted_by_position: list[int] = field(default_factory=list)

    @property
    def round_trips(self) -> int:
        return self.score_requests + self.decodes


def judge(
    draft: Sequence[int], top1: Sequence[int], gaps: Sequence[float], near_tie: float
) -> tuple[list[int], int, bool]:
    """(tokens to commit, draft tokens accepted, ended on a near tie) for one scored round."""
    commit: list[int] = []
    for i, token in enumerate(draft):
        if gaps[i] < near_tie:
            return commit, len(commit), True
        if top1[i] != token:
            return [*commit, top1[i]], len(commit), False
        commit.append(token)
    if gaps[len(draft)] < near_tie:
        return commit, len(commit), True
    return [*commit, top1[len(draft)]], len(draft), False


class VerifyLoop:
    """One answer's tokens, committed round by round (iterate :meth:`tokens`)."""

    def __init__(
        self,
        client: EngineClient,
        context: TokenIds,
        drafter: Drafter | None,
        budget: int,
        pacing: Pacing,
        eos_ids: set[int],
        ask: Ask,
        near_tie: float = NEAR_TIE,
    ) -> None:
        self.client = client
        self.context = context  # the prompt, then every committed token
        self.prompt_tokens = len(context)
        self.ask = ask
        self.drafter = drafter
        self.budget = budget
        self.pacing = pacing
        self.eos_ids = eos_ids
        self.near_tie = near_tie
        self.out: list[int] = []
        self.stats = LoopStats()
        self._controller = pacing.controller()

    def _commit(self, tokens: list[int]) -> list[int]:
        tokens = tokens[: self.budget - len(self.out)]
        self.out += tokens
        self.context.extend(tokens)
        if self.drafter is not None:
            self.drafter.extend(tokens)
        return tokens

    @property
    def _ended(self) -> bool:
        return len(self.out) >= self.budget or bool(self.out and self.out[-1] in self.eos_ids)

    def _draft(self) -> Draft:
        left = self.budget - len(self.out)
        if self.client.max_model_len is not None:  # a round's tokens and the next one fit
            left = min(left, self.client.max_model_len - len(self.context))
        if self.drafter is None or left < 2:
            return Draft.empty()
        limit, _ = self._controller.budget()
        return self._controller.choose(self.drafter.propose(min(limit, left - 1), 1))

    async def tokens(self) -> AsyncGenerator[list[int], None]:
        """Committed tokens as they are decided (the last batch may end with EOS)."""
        while not self._ended:
            draft = self._draft()
            try:
                if len(draft) == 0:
                    async for batch in self._decode(DECODE_CHUNK):
                        yield batch
                    continue
                async for batch in self._round(draft.tokens.tolist()):
                    yield batch
            except RemoteFailure:
                if self._ended:
                    return
                self.stats.recovered += 1
                async for batch in self._decode(self.budget - len(self.out)):
                    yield batch
                return

    async def _round(self, draft: list[int]) -> AsyncIterator[list[int]]:
        scored = await self.client.score(self.context, draft, self.ask)
        self.pacing.note_round_trip(scored.seconds)
        stats = self.stats
        stats.rounds += 1
        stats.score_requests += scored.requests
        stats.drafted += len(draft)
        commit, accepted, tie = judge(draft, scored.top1, scored.gaps, self.near_tie)
        stats.accepted += accepted
        while len(stats.accepted_by_position) < accepted:
            stats.accepted_by_position.append(0)
        for i in range(accepted):
            stats.accepted_by_position[i] += 1
        self._controller.observe(len(draft), accepted)
        committed = self._commit(commit)
        if committed:
            yield committed
        if tie and not self._ended:
            stats.near_ties += 1
            async for batch in self._decode(1):
                yield batch

    async def _decode(self, n: int) -> AsyncIterator[list[int]]:
        """The engine's own greedy decoding of up to ``n`` more tokens."""
        n = min(n, self.budget - len(self.out))
        self.stats.decodes += 1
        t0 = time.perf_counter()
        got = 0
        async for new in self.client.decode(self.context, n, self.ask):
            committed = self._commit(new)
            got += len(committed)
            if committed:
                yield committed
            if self._ended:
                break
        self.pacing.note_decode(time.perf_counter() - t0, got)
        if got < n and not self._ended:  # the engine stopped on its own (a stop token)
            self.budget = len(self.out)


def expected_tokens(draft: Draft) -> float:
    """Tokens a round carrying ``draft`` commits on average (1 + its path scores)."""
    return 1.0 + float(draft.scores.sum()) if len(draft) else 1.0
