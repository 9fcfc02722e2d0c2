"""Weighted fair shares of each step's cost between tenants.

On a CPU a step costs a fixed part (the weights read) plus more with every row, and a row
more with every context token it attends; so the scheduler shares a step by what each
tenant's rows cost (``row_prices``), not by their count. A tenant's allowance in a step is
its weight's share beside the busiest other tenant (what that one asks for), or of
``FLOOR`` times the step's fixed part, whichever is larger, plus a bank of what it left
unspent in earlier steps (at most ``BURST`` fixed parts, or its dearest pending row). So
with equal weights a tenant's rows cost no more than the other's, and a step beside it
costs less than twice the other's alone (its fixed part and rows), averaged over the banks'
bursts; one beside a tenant whose rows cost little still runs a share of the fixed part's
worth; one whose drafts come in bursts spends what it saved (neither in a step that
computes a prompt, which may bring its first token).

A tenant's prompt chunks beside another tenant's decode rows, or beside the end of its
prompt (the step that brings its first token), cost at most its weighted share of that
tenant's step alone (the fixed part and that tenant's rows), less what its own decode rows
cost in the step: a prompt row at a long context costs as much as many short ones, so
counting rows alone would let one tenant's long prompts make every step of another's
answers several times slower.

``StepShares.turns`` picks the decode rows: each tenant's requests that waited longest
whose pending rows fit its allowance; one whose next row costs more waits, banking its
share, so a row at a long context decodes in fewer steps instead of making every step
slow. ``StepShares.drafts`` then cuts the drafts of a tenant whose rows with their drafts
would cost more than its allowance (the longest drafts first). A tenant with no request
decoding but some computing their prompts counts one row per such request, so the step
that brings its first token carries only that share of the others' rows.

Which rows run in a step changes when a request's tokens come, never which tokens: a row's
logits do not depend on what else is in the step, and a cut draft only costs speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from local_verifier.fair_queue import Queued

FLOOR = 0.5  # no allowance below this many fixed parts of a step (weighted share)
BURST = 1.0  # the most a tenant banks, in fixed parts of a step
SLACK = 1e-9  # relative: costs equal up to rounding fit


class Decoding(Queued, Protocol):
    """What ``StepShares.turns`` reads of a decoding request."""

    turn: int  # the step it last decoded in (lower: waited longer)


D = TypeVar("D", bound=Decoding)
Q = TypeVar("Q", bound=Queued)


def demands(
    decoding: Iterable[Q], prefilling: Iterable[Q], cost: Callable[[Q], float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Each tenant's cost in the step, and its weight: its decoding requests' costs, or,
    with none decoding, its requests in prefill at one row each."""
    demand: dict[str, float] = {}
    weights: dict[str, float] = {}
    for req in decoding:
        demand[req.owner] = demand.get(req.owner, 0.0) + cost(req)
        weights[req.owner] = req.weight
    first: dict[str, float] = {}  # tenants whose every running request is in prefill
    for req in prefilling:
        if req.owner not in demand:
            first[req.owner] = first.get(req.owner, 0.0) + cost(req)
            weights[req.owner] = req.weight
    return demand | first, weights


def allowances(
    demand: dict[str, float], weights: dict[str, float], floor: float
) -> dict[str, float]:
    """Each tenant's weighted share beside the busiest other tenant (costs per weight), or
    of ``floor`` seconds, whichever is larger."""
    least = floor / sum(weights.values())
    return {
        owner: weights[owner]
        * max(max(demand[u] / weights[u] for u in demand if u != owner), least)
        for owner in demand
    }


class StepShares:
    """Decode turns and draft sizes by cost, each tenant's unspent allowance banked."""

    def __init__(self, burst: float = BURST) -> None:
        self.burst = burst
        self.bank: dict[str, float] = {}  # seconds of allowance each tenant saved
        self._asked: dict[str, float] = {}  # this step's demands, weights and fixed part
        self._weights: dict[str, float] = {}
        self._fixed = 0.0
        self._prompts = False  # whether the step computes a prompt
        self._dearest: dict[str, float] = {}  # each tenant's dearest pending row this step
        self._decoding: dict[str, float] = {}  # each decoding tenant's demand this step
        self._kept: dict[str, float] = {}  # what each tenant's picked decode rows cost

    def turns(
        self,
        decoding: list[D],
        prefilling: Sequence[D],
        cost: Callable[[D], float],
        fixed: float,
    ) -> list[D]:
        """The requests that decode this step, in their given order: with one tenant, all;
        with several, each tenant's that waited longest whose ``cost`` (a pending row's
        seconds) fits its allowance and bank. ``fixed``: a step's fixed seconds."""
        demand, weights = demands(decoding, prefilling, cost)
        self._asked, self._weights, self._fixed = demand, weights, fixed
        self._prompts = bool(prefilling)
        self._dearest = {}
        self._decoding = {r.owner: demand[r.owner] for r in decoding}
        self._kept = {}
        for req in decoding:
            self._dearest[req.owner] = max(self._dearest.get(req.owner, 0.0), cost(req))
        for owner in [o for o in self.bank if o not in demand]:
            del self.bank[owner]
        if len(demand) < 2:
            self.bank.clear()
            return decoding
        allowed = allowances(demand, weights, self._floor())
        keep: set[int] = set()
        for owner in {r.owner: None for r in decoding}:
            budget = (allowed[owner] + self._banked(owner)) * (1 + SLACK)
            mine = [r for r in decoding if r.owner == owner]
            if demand[owner] <= budget:
                keep.update(id(r) for r in mine)
                self._kept[owner] = demand[owner]
                continue
            spent = 0.0
            for req in sorted(mine, key=lambda r: r.turn):
                if spent + cost(req) > budget:
                    break
                spent += cost(req)
                keep.add(id(req))
            self._kept[owner] = spent
        return [r for r in decoding if id(r) in keep]

    def prompt_allowances(
        self, owners: Iterable[str], finishing: Mapping[str, float]
    ) -> dict[str, float | None]:
        """Seconds each of ``owners``' prompt chunks may cost in the step ``turns`` picked
        last: its weighted share of the busiest other tenant's step alone (the fixed part,
        that tenant's decode rows and, where its prompts end in the step, their chunks:
        ``finishing``, seconds by tenant), less its own decode rows' cost; None where no
        other tenant decodes or ends a prompt (its chunks are then shared by rows)."""
        alone = {
            u: self._fixed + self._decoding.get(u, 0.0) + finishing.get(u, 0.0)
            for u in {*self._decoding, *finishing}
        }
        w = self._weights
        out: dict[str, float | None] = {}
        for owner in owners:
            others = [alone[u] / w[u] for u in alone if u != owner]
            share = w[owner] * max(others) if others else None
            out[owner] = None if share is None else max(share - self._kept.get(owner, 0.0), 0.0)
        return out

    def drafts(
        self,
        owners: Sequence[str],
        sizes: Sequence[int],
        base: Sequence[float],
        per_row: Sequence[float],
    ) -> list[int]:
        """Draft sizes within each tenant's allowance and bank, for the requests ``turns``
        picked last (the banks then updated to what the step spends): request i of tenant
        ``owners[i]`` costs ``base[i] + sizes[i] * per_row[i]``. A tenant counts with the
        larger of that and what it asked for; one with no row in the step spends nothing.
        The longest drafts of a tenant are cut first (a cut draft keeps its first nodes)."""
        spent = dict.fromkeys(self._asked, 0.0)
        for owner, k, row_base, row in zip(owners, sizes, base, per_row, strict=True):
            spent[owner] = spent.get(owner, 0.0) + row_base + k * row
        out = list(sizes)
        if len(spent) < 2:
            return out
        asked = {o: max(self._asked.get(o, 0.0), spent[o]) for o in spent}
        allowed = allowances(asked, self._weights, self._floor())
        for owner in spent:
            budget = allowed[owner] + self._banked(owner)
            mine = [i for i, o in enumerate(owners) if o == owner]
            while mine and spent[owner] > budget * (1 + SLACK):
                longest = max(mine, key=lambda i: out[i])
                if out[longest] == 0:
                    break
                out[longest] -= 1
                spent[owner] -= per_row[longest]
            if not self._prompts:
                saved = self.bank.get(owner, 0.0) + allowed[owner] - spent[owner]
                most = max(self.burst * self._fixed, self._dearest.get(owner, 0.0))
                self.bank[owner] = min(max(saved, 0.0), most)
        return out

    def _floor(self) -> float:
        """The least allowance's seconds: none in a step that computes a prompt (whose
        first token it may bring)."""
        return 0.0 if self._prompts else FLOOR * self._fixed

    def _banked(self, owner: str) -> float:
        """What ``owner`` may spend of its bank in this step (nothing where it computes a
        prompt)."""
        return 0.0 if self._prompts else self.bank.get(owner, 0.0)
