"""A step's drafts: each tenant's planned for its own tokens, then cut to its share.

``lookup.controller.plan_batch`` keeps the draft nodes worth their rows for the tokens
per second of the requests it plans. Planned over every tenant at once, one tenant's many
pending rows (its tokens come anyway) would make every draft row look dear, and another's
drafts would shrink beside it; so each tenant's drafts are planned for its own requests'
tokens (the step's other rows counted in its cost), then cut to its shares of the token
budget and of the step's cost (``step_shares``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

from local_verifier.request import Request
from local_verifier.row_prices import RowPrice
from local_verifier.step_shares import StepShares
from lookup.draft import Draft

Plan = Callable[[str, list[Draft]], list[Draft]]


class HostTimes:
    """Each request's host seconds per step besides the forward (proposing its draft,
    verifying its rows, emitting its tokens): a running mean over the steps it ran in."""

    def __init__(self, weight: float = 0.3) -> None:
        self.weight = weight  # of the newest step
        self._mean: weakref.WeakKeyDictionary[Request, float] = weakref.WeakKeyDictionary()
        self._step: dict[Request, float] = {}

    def add(self, req: Request, seconds: float) -> None:
        """``req`` spent ``seconds`` more on the host in this step."""
        self._step[req] = self._step.get(req, 0.0) + seconds

    def end_step(self) -> None:
        for req, seconds in self._step.items():
            mean = self._mean.get(req)
            self._mean[req] = seconds if mean is None else mean + self.weight * (seconds - mean)
        self._step.clear()

    def of(self, req: Request) -> float:
        return self._mean.get(req, 0.0)


def pending_cost(req: Request, price: RowPrice, host: HostTimes) -> float:
    """Seconds of ``req``'s pending row (a request in prefill: of its first decode row),
    with its host time per step."""
    context = req.to_fill if req.prefilling else req.computed
    return price.seq(1, context) + host.of(req)


def fair_plan(
    decoding: Sequence[Request],
    proposed: list[Draft],
    plan: Plan,
    shares: StepShares,
    price: RowPrice,
    host: HostTimes,
    token_shares: dict[str, int],
    room: int,
) -> list[Draft]:
    """Each tenant's drafts planned by ``plan(owner, its requests' proposals)``, then cut
    to its shares: at most ``token_shares[t]`` draft rows of tenant t (none given: no cap),
    and its rows within its share of the step's cost; at most ``room`` draft rows in all
    (the longest cut first). The step shares' banks are then updated to what the step
    spends."""
    owners = [r.owner for r in decoding]
    drafts = list(proposed)
    for owner in dict.fromkeys(owners):
        mine = [i for i, o in enumerate(owners) if o == owner]
        for i, draft in zip(mine, plan(owner, [proposed[i] for i in mine]), strict=True):
            drafts[i] = draft
    left = dict(token_shares)
    sizes = [len(d) for d in drafts]
    for i, owner in enumerate(owners):
        if owner in left:
            sizes[i] = min(sizes[i], left[owner])
            left[owner] -= sizes[i]
    while sum(sizes) > max(room, 0):
        sizes[max(range(len(sizes)), key=lambda i: sizes[i])] -= 1
    base = [pending_cost(r, price, host) for r in decoding]
    per_row = [price.row(r.computed) for r in decoding]
    sizes = shares.drafts(owners, sizes, base, per_row)
    return [_first(d, k) for d, k in zip(drafts, sizes, strict=True)]


def _first(draft: Draft, k: int) -> Draft:
    """The draft's first ``k`` nodes (closed under parents)."""
    return draft if k == len(draft) else draft.subset(list(range(k)))
