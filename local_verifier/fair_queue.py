"""Weighted fair sharing of the engine between tenants: deficit round robin (Shreedhar and
Varghese, 1995) over per-tenant FIFO queues.

Admission: each visit in turn gives a tenant ``weight`` credits; admitting a request costs
one (a batch place), so over time tenants are admitted in proportion to their weights
whatever each one sends. A tenant whose first request cannot be admitted now (no room in
the KV pool) is passed over, never blocking the others. A tenant's queue empties its
credit, so waiting cannot be banked.

Per step: ``split`` shares a token budget between tenants by weight, with the same
carried-over deficits, so one tenant's long prompts cannot take every step's prefill
(decode rows and drafts are shared by their cost: ``step_shares``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """What the fair queue reads of a request."""

    owner: str  # the tenant whose share the request uses
    weight: float  # the tenant's weight (> 0)


R = TypeVar("R", bound=Queued)


class FairQueue(Generic[R]):
    """Per-tenant FIFO queues of waiting requests, served by deficit round robin."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[R]] = {}  # non-empty queues, in round-robin order
        self._credit: dict[str, float] = {}
        self._weight: dict[str, float] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def __iter__(self) -> Iterator[R]:
        for queue in self._queues.values():
            yield from queue

    def owners(self) -> list[str]:
        """Tenants with requests waiting."""
        return list(self._queues)

    def first(self, owner: str) -> R:
        """The request of ``owner`` that would be admitted next."""
        return self._queues[owner][0]

    def count(self, owner: str) -> int:
        """Requests of ``owner`` waiting."""
        queue = self._queues.get(owner)
        return 0 if queue is None else len(queue)

    def append(self, request: R, *, front: bool = False) -> None:
        """Queue ``request`` at the back of its tenant's queue (``front``: at its front,
        still behind every other tenant's turn)."""
        owner = request.owner
        queue = self._queues.get(owner)
        if queue is None:
            queue = self._queues[owner] = deque()
            self._credit[owner] = 0.0
        self._weight[owner] = request.weight
        if front:
            queue.appendleft(request)
        else:
            queue.append(request)

    def extend(self, requests: Iterable[R]) -> None:
        for request in requests:
            self.append(request)

    def remove(self, request: R) -> None:
        queue = self._queues[request.owner]
        queue.remove(request)
        if not queue:
            self._drop(request.owner)

    def clear(self) -> None:
        self._queues.clear()
        self._credit.clear()

    def _drop(self, owner: str) -> None:
        del self._queues[owner]
        del self._credit[owner]

    def pop(self, admissible: Callable[[R], bool]) -> R | None:
        """The next request by deficit round robin among tenants whose first request is
        ``admissible``; None when there is none."""
        blocked: set[str] = set()
        while len(blocked) < len(self._queues):
            owner = next(iter(self._queues))
            queue = self._queues[owner]
            if owner not in blocked and self._credit[owner] >= 1.0:
                head = queue[0]
                if admissible(head):
                    queue.popleft()
                    self._credit[owner] -= 1.0
                    if not queue:
                        self._drop(owner)
                    elif self._credit[owner] < 1.0:  # its turn is over
                        self._queues[owner] = self._queues.pop(owner)
                    return head
                blocked.add(owner)
            elif owner not in blocked:
                self._credit[owner] += self._weight[owner]
                if self._credit[owner] >= 1.0:
                    continue  # its turn now: served on the next pass of the loop
            self._queues[owner] = self._queues.pop(owner)  # to the back of the round
        return None


def split(
    budget: int,
    wants: Mapping[str, int],
    weights: Mapping[str, float],
    credit: dict[str, float],
    caps: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """Share ``budget`` tokens between tenants wanting ``wants[t]`` tokens: each gets its
    share by ``weights`` (every running tenant's, wanting or not) plus the ``credit`` it
    carried over (updated in place), what the others leave goes on up to ``caps[t]``
    (None: no cap); a tenant wanting nothing loses its credit."""
    for owner in [o for o in credit if not wants.get(o)]:
        del credit[owner]
    active = [o for o, want in wants.items() if want > 0]
    grant = dict.fromkeys(active, 0)
    if not active or budget <= 0:
        return grant
    total = sum(weights.values())  # every running tenant's weight: its share is kept for it
    left = budget
    for owner in active:  # weighted shares (and carried credit), at least one token each
        credit[owner] = credit.get(owner, 0.0) + budget * weights[owner] / total
        take = min(wants[owner], max(int(credit[owner]), 1), left)
        grant[owner] = take
        credit[owner] -= take
        left -= take
    for owner in active:  # what some leave, to those wanting more
        cap = wants[owner] if caps is None else max(caps.get(owner, wants[owner]), grant[owner])
        more = min(min(wants[owner], cap) - grant[owner], left)
        grant[owner] += more
        left -= more
        if grant[owner] == wants[owner]:  # no backlog: nothing to carry over
            credit[owner] = 0.0
    return grant
