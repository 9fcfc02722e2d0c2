"""The batch's places and the KV pool's blocks: who runs, who waits, who is preempted.

Requests join (when the pool has blocks for their prompt; tenants take turns by deficit
round robin, ``fair_queue``) and leave between steps; a cancelled request's blocks go back
to the pool at the next step. With the batch full, a tenant waiting below its weighted
share of the batch's places takes one from the tenant furthest above its share, whose
latest request is preempted; likewise with the pool full, a tenant waiting below its
weighted share of the pool's blocks takes them from the tenant furthest above its share.
The pool evicts cached blocks by the same shares (``kv_pool``): one tenant's growth does not
take another's cached prompts while that one stays within its share, and takes them last
for a while after its last request.

KV blocks are taken as tokens are committed. When the pool runs out, the latest request of
the tenant furthest above its weighted share of the pool's blocks is preempted: its blocks
are freed and it waits first in its tenant's line to recompute its K/V (from the prefix
cache where its blocks still are) and go on where it stopped. A row's K/V and logits do
not depend on what else shares its forward pass or on how its prompt was chunked, so the
resumed answer is the uninterrupted one, bit for bit.
"""

from __future__ import annotations

import functools
import time
from collections import Counter

from local_verifier.fair_queue import FairQueue
from local_verifier.kv_pool import (
    BlockTable,
    KVPool,
    PoolExhausted,
    block_keys,
    chain_key,
    root_key,
)
from local_verifier.request import Request

# An owner keeps its share of the pool this long after its last request ended: its cache
# is evicted after the caches above their shares while it is between two requests.
CACHE_GRACE_S = 10.0


class Admission:
    """The waiting line, the running batch and their blocks in the pool."""

    def __init__(self, pool: KVPool, max_batch: int = 16, prefix_cache: bool = True) -> None:
        self.pool = pool
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.waiting: FairQueue[Request] = FairQueue()
        self.running: list[Request] = []
        self.hit_tokens = 0  # prompt tokens found in the prefix cache
        self.miss_tokens = 0  # prompt tokens computed
        self.preemptions = 0  # requests whose blocks were taken back to let others run
        self._claimed: tuple[list[bytes], list[int]] = ([], [])  # the admitted one's prefix
        self._seen: dict[str, tuple[float, float]] = {}  # owner -> its weight, last seen
        self._preempted_now: set[int] = set()  # ids of the requests preempted this pass

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def drop_cancelled(self) -> None:
        for req in [r for r in self.running if r.cancelled]:
            self.finish(req)
        for req in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(req)
            self.finish(req)

    def admit(self) -> None:
        """Tell the pool the step's shares (``grow`` and the step's reservations evict by
        them); run waiting requests while places and blocks allow, taking blocks back for a
        tenant below its share of them; then share the places. A request preempted in
        this pass waits for the next step's: the blocks it gave back are for others (run
        again at once, it would take them back and be preempted again, without end)."""
        self._share_pool()
        self._preempted_now.clear()
        while True:
            while len(self.running) < self.max_batch:
                head = self.waiting.pop(self._fits)
                if head is None:
                    break
                self._start(head)
            if len(self.running) >= self.max_batch or not self._reclaim():
                break
        self._rebalance()

    def grow(self) -> None:
        """Give every running request a block for its next row, highest priority first;
        when the pool is out, preempt the latest request of the tenant furthest above its
        share of the blocks (which may be the one asking) until there is one."""
        for req in sorted(self.running, key=Request.priority):
            while req in self.running:
                assert req.table is not None
                try:
                    req.table.reserve(req.computed + 1)
                    break
                except PoolExhausted:
                    self._preempt(self._victim())

    def room(self, req: Request, end: int) -> int:
        """Reserve blocks for ``req``'s positions up to ``end`` as far as the pool allows
        without preempting; the end reserved."""
        assert req.table is not None
        bs = self.pool.block_size
        end = min(end, (len(req.table.blocks) + self.pool.available(req.owner)) * bs)
        req.table.reserve(end)
        return end

    def publish(self, req: Request) -> None:
        """Index the request's newly committed full blocks (draft rows never are)."""
        if not self.prefix_cache or req.table is None:
            return
        bs = self.pool.block_size
        while (len(req.keys) + 1) * bs <= req.computed:
            i = len(req.keys)
            parent = req.keys[-1] if req.keys else root_key(req.tenant)
            req.keys.append(chain_key(parent, req.tokens[i * bs : (i + 1) * bs]))
            self.pool.publish(req.table.blocks[i], req.keys[-1], req.owner)

    def finish(self, req: Request, error: Exception | None = None) -> None:
        """Release the request's blocks and tell its owner it is over."""
        if req in self.running:
            self.running.remove(req)
        if req.table is not None:
            req.table.release()
            req.table = None
        if error is None:
            self.release_followers(req)
        for follower in req.followers:  # a failed forward fails the siblings too
            self.finish(follower, error)
        req.on_finish(req, error)

    def release_followers(self, req: Request) -> None:
        """Queue ``req``'s followers first in its tenant's line (its prompt blocks are
        published now); other tenants' turns come as before."""
        for follower in reversed(req.followers):
            self.waiting.append(follower, front=True)
        req.followers = []

    def fail_all(self, error: Exception) -> None:
        """End every request (a forward failed): each owner gets ``error``."""
        for req in [*self.running, *self.waiting]:
            self.finish(req, error)
        self.waiting.clear()

    def _fits(self, req: Request, among: frozenset[str] | None = None) -> bool:
        """Whether the pool has room for ``req``'s prompt (or, resumed, its tokens) and
        then one more block for each running request (its cached prefix blocks claimed);
        False for a tenant not ``among`` those given."""
        if (among is not None and req.owner not in among) or id(req) in self._preempted_now:
            return False
        bs = self.pool.block_size
        keys: list[bytes] = []
        hits: list[int] = []
        if self.prefix_cache:  # until decoding, the last token is computed (its logits)
            cacheable = req.tokens[:-1] if req.pending is not None else req.prompt_ids[:-1]
            keys = block_keys(req.tenant, cacheable, bs)
            hits = self.pool.lookup(keys, req.owner)
        if -(-_fill(req) // bs) - len(hits) + len(self.running) > self.pool.available(req.owner):
            self.pool.release(hits, req.owner)
            return False
        self._claimed = (keys, hits)
        return True

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
            freed = len(victim.table.blocks)
            bs = self.pool.block_size
            if all(
                -(-_fill(self.waiting.first(o)) // bs) > self.pool.available(o) + freed
                for o in starved
            ):
                return  # no starved request would fit even then: nothing to preempt for
            self._preempt(victim)
            head = self.waiting.pop(functools.partial(self._fits, among=frozenset(starved)))
            if head is None:
                return
            self._start(head)

    def _held(self) -> dict[str, set[int]]:
        """The pool's blocks each running tenant's requests hold."""
        held: dict[str, set[int]] = {}
        for req in self.running:
            assert req.table is not None
            held.setdefault(req.owner, set()).update(req.table.blocks)
        return held

    def _share_pool(self) -> None:
        """Tell the pool what its eviction shares by: the owners with requests here
        (active), and each owner's share of the blocks, by weight among those with a
        request here or within the last ``CACHE_GRACE_S``."""
        now = time.monotonic()
        active = {r.owner: r.weight for r in (*self.running, *self.waiting)}
        self.pool.active = set(active)
        self._seen.update((o, (w, now)) for o, w in active.items())
        self._seen = {o: (w, t) for o, (w, t) in self._seen.items() if now - t <= CACHE_GRACE_S}
        total = sum(w for w, _ in self._seen.values())
        self.pool.shares = {o: self.pool.n_blocks * w / total for o, (w, _) in self._seen.items()}

    def _block_shares(self, owners: set[str]) -> dict[str, float]:
        """Each of ``owners``' weighted share of the pool's blocks (the tenants running and
        waiting share it)."""
        weights = {r.owner: r.weight for r in (*self.running, *self.waiting)}
        total = sum(weights.values())
        return {o: self.pool.n_blocks * weights[o] / total for o in owners}

    def _victim(
        self, held: dict[str, set[int]] | None = None, share: dict[str, float] | None = None
    ) -> Request:
        """The latest request of the tenant furthest above its share of the pool's blocks
        (``held``, ``share``: ``_held()`` and those tenants' ``_block_shares``, if known)."""
        held = self._held() if held is None else held
        share = self._block_shares(set(held)) if share is None else share
        owner = max(held, key=lambda o: len(held[o]) - share[o])
        return max((r for r in self.running if r.owner == owner), key=Request.priority)

    def _reclaim(self) -> bool:
        """With a tenant waiting below its weighted share of the pool's blocks (its next
        request not fitting), preempt the latest request of the tenant furthest above its
        share, if that tenant stays at or above it; whether one was."""
        if not self.waiting or not self.running:
            return False
        held = self._held()
        share = self._block_shares(set(held) | set(self.waiting.owners()))
        if not any(len(held.get(o, ())) < share[o] for o in self.waiting.owners()):
            return False
        victim = self._victim(held, share)
        mine = held[victim.owner]
        assert victim.table is not None
        others = set().union(*(r.table.blocks for r in self.running if r is not victim and r.table))
        if len(mine) - len(set(victim.table.blocks) - others) < share[victim.owner]:
            return False
        self._preempt(victim)
        return True

    def _start(self, head: Request) -> None:
        """Run ``head``: its table holds the prefix blocks ``_fits`` claimed and its prompt's."""
        keys, hits = self._claimed
        bs = self.pool.block_size
        head.table = BlockTable(self.pool, head.owner)
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
        self._preempted_now.add(id(req))
        self.waiting.append(req, front=True)


def _fill(req: Request) -> int:
    """Positions ``req`` fills once admitted: its prompt, or resumed, its tokens so far."""
    return req.to_fill if req.tokens else len(req.prompt_ids)
