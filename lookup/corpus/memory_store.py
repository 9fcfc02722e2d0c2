"""The embedded in-memory store: the same semantics as the Redis store, in one process."""

from __future__ import annotations

import builtins
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lookup.corpus.anchors import INDEX_ANCHOR_BYTES, INDEX_DOC_BYTES, KEY_BYTES, MAX_POSTINGS
from lookup.corpus.documents import Document, DocumentMeta
from lookup.corpus.keys import digest
from lookup.corpus.store import PURGE_BATCH, RETRIEVE_SCAN, Limits, NewDocument


@dataclass
class _Entry:
    doc: NewDocument
    created: float
    last_used: float
    order: str  # tie-break among equal times, as Redis sorted sets order members
    num: int = 0  # number in the retrieval index (newer documents have larger numbers)
    anchors: list[int] = field(default_factory=list)  # the anchors indexed for it
    captured: bool = False  # counted against the captured caps, not the uploaded ones

    @property
    def index_cost(self) -> int:
        return len(self.anchors) * INDEX_ANCHOR_BYTES + INDEX_DOC_BYTES if self.anchors else 0

    @property
    def captured_cost(self) -> int:
        """The bytes a captured document counts toward its caps (its index entry's too)."""
        return self.doc.bytes + self.doc.meta_bytes + self.index_cost

    def meta(self) -> DocumentMeta:
        d = self.doc
        return DocumentMeta(
            d.id, d.sha256, d.bytes, d.path, d.language, self.created, self.last_used
        )


@dataclass
class _Namespace:
    entries: dict[str, _Entry] = field(default_factory=dict)
    answers: dict[str, float] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    blobs: dict[str, str] = field(default_factory=dict)
    refs: dict[str, int] = field(default_factory=dict)
    stored_bytes: int = 0
    tokens: dict[tuple[str, str], bytes] = field(default_factory=dict)
    index: dict[int, list[int]] = field(default_factory=dict)  # anchor -> document numbers
    nums: dict[int, str] = field(default_factory=dict)  # document number -> id
    index_bytes: int = 0
    captured: set[str] = field(default_factory=set)
    captured_bytes: int = 0
    seq: int = 0
    oldest: float = float("inf")  # a lower bound of every entry's last use
    anchor_key: bytes = field(default_factory=lambda: os.urandom(KEY_BYTES))

    def index_add(self, doc_id: str, entry: _Entry) -> None:
        self.seq += 1
        entry.num = self.seq % (1 << 32)
        for anchor in entry.doc.anchors.tolist():
            found = self.index.setdefault(anchor, [])
            if len(found) < MAX_POSTINGS:
                found.append(entry.num)
                entry.anchors.append(anchor)
        if entry.anchors:
            self.nums[entry.num] = doc_id
            self.index_bytes += entry.index_cost

    def index_drop(self, entry: _Entry) -> None:
        if not entry.anchors:
            return
        for anchor in entry.anchors:
            found = self.index[anchor]
            found.remove(entry.num)
            if not found:
                del self.index[anchor]
        del self.nums[entry.num]
        self.index_bytes -= entry.index_cost

    def retrieve(self, query: np.ndarray, limit: int, cutoff: float) -> list[str]:
        """Ids of the first ``limit`` live documents among the ``limit * RETRIEVE_SCAN``
        best matching the query anchors."""
        score: dict[int, float] = {}
        for anchor in query.tolist():
            found = self.index.get(anchor, [])
            for num in found:
                score[num] = score.get(num, 0.0) + 1 / len(found)
        best = sorted(score, key=lambda num: (-score[num], -num))[: limit * RETRIEVE_SCAN]
        live = [self.nums[num] for num in best if self.live(self.nums[num], cutoff)]
        return live[:limit]

    def live(self, doc_id: str, cutoff: float) -> bool:
        """Whether the document is stored and was used since ``cutoff``."""
        entry = self.entries.get(doc_id)
        return entry is not None and entry.last_used >= cutoff

    def add_ref(self, doc: NewDocument) -> None:
        if doc.sha256 not in self.refs:
            self.blobs[doc.sha256] = doc.text
            self.stored_bytes += doc.bytes
        self.refs[doc.sha256] = self.refs.get(doc.sha256, 0) + 1

    def drop_ref(self, doc: NewDocument) -> None:
        self.refs[doc.sha256] -= 1
        if self.refs[doc.sha256] <= 0:
            del self.refs[doc.sha256]
            del self.blobs[doc.sha256]
            self.stored_bytes -= doc.bytes
            for key in [k for k in self.tokens if k[1] == doc.sha256]:
                del self.tokens[key]

    def drop_names(self, doc_id: str, entry: _Entry) -> None:
        for name in entry.doc.names:
            if self.names.get(name) == doc_id:
                del self.names[name]

    def uncount(self, doc_id: str, entry: _Entry) -> None:
        """Take ``entry`` off the answer and captured lists and counts (before its index
        entry is dropped)."""
        self.answers.pop(doc_id, None)
        if entry.captured:
            self.captured.discard(doc_id)
            self.captured_bytes -= entry.captured_cost
        self.stored_bytes -= entry.doc.meta_bytes

    def remove(self, doc_id: str) -> bool:
        entry = self.entries.pop(doc_id, None)
        if entry is None:
            return False
        self.uncount(doc_id, entry)
        self.drop_names(doc_id, entry)
        self.index_drop(entry)
        self.drop_ref(entry.doc)
        return True

    def purge(self, cutoff: float) -> None:
        """Remove the oldest ``PURGE_BATCH`` documents unused since ``cutoff`` (the others
        count as gone until a later call removes them)."""
        if cutoff <= self.oldest:
            return
        expired = [
            (e.last_used, e.order, i) for i, e in self.entries.items() if e.last_used < cutoff
        ]
        for _, _, doc_id in sorted(expired)[:PURGE_BATCH]:
            self.remove(doc_id)
        self.oldest = min((e.last_used for e in self.entries.values()), default=float("inf"))

    def over(self, limits: Limits, captured: bool) -> bool:
        """Whether the captured (or the uploaded) documents are above one of their caps."""
        if captured:
            return (
                len(self.captured) > limits.max_captured_docs
                or self.captured_bytes > limits.max_captured_bytes
            )
        return (
            len(self.entries) - len(self.captured) > limits.max_ns_docs
            or self.stored_bytes + self.index_bytes - self.captured_bytes > limits.max_ns_bytes
        )

    def lru_order(self) -> list[str]:
        return sorted(
            self.entries, key=lambda i: (self.entries[i].last_used, self.entries[i].order)
        )


class MemoryDocumentStore:
    """Documents in process memory (the default when no Redis is configured)."""

    def __init__(self) -> None:
        self._spaces: dict[str, _Namespace] = {}
        self.round_trips = 0

    def _space(self, ns: str, limits: Limits | None, now: float | None) -> _Namespace:
        self.round_trips += 1
        space = self._spaces.setdefault(ns, _Namespace())
        if limits is not None and now is not None:
            space.purge(now - limits.ttl_s)
        return space

    async def put(
        self,
        ns: str,
        doc: NewDocument,
        *,
        answer: bool,
        limits: Limits,
        now: float,
        captured: bool = False,
    ) -> DocumentMeta:
        space = self._space(ns, limits, now)
        if not space.live(doc.id, now - limits.ttl_s):  # expired, not yet purged: gone
            space.remove(doc.id)
        old = space.entries.get(doc.id)
        created = now
        if old is not None:
            created = old.created
            space.uncount(doc.id, old)
            space.drop_names(doc.id, old)
            space.index_drop(old)
            if old.doc.sha256 != doc.sha256:
                space.drop_ref(old.doc)
                space.add_ref(doc)
        else:
            space.add_ref(doc)
        entry = _Entry(doc, created, now, digest(doc.id), captured=captured)
        space.index_add(doc.id, entry)
        space.entries[doc.id] = entry
        space.oldest = min(space.oldest, now)
        space.stored_bytes += doc.meta_bytes
        for name in doc.names:
            space.names[name] = doc.id
        if answer:
            space.answers[doc.id] = now
        if captured:
            space.captured.add(doc.id)
            space.captured_bytes += entry.captured_cost
        for victim in space.lru_order() if space.over(limits, captured) else []:
            if not space.over(limits, captured):
                break
            if victim != doc.id and (victim in space.captured) == captured:
                space.remove(victim)
        return entry.meta()

    async def select(
        self,
        ns: str,
        *,
        ids: Sequence[str],
        names: Sequence[str],
        recent: int,
        query: np.ndarray,
        retrieve: int,
        max_docs: int,
        max_bytes: int,
        limits: Limits,
        now: float,
    ) -> list[Document]:
        space = self._space(ns, limits, now)
        candidates = [(i, "named") for i in ids]
        candidates += [(space.names[n], "named") for n in names if n in space.names]
        if recent > 0:
            newest = sorted(
                space.answers,
                key=lambda i: (space.answers[i], space.entries[i].order),
                reverse=True,
            )
            candidates += [(i, "answer") for i in newest[:recent]]
        cutoff = now - limits.ttl_s
        if retrieve > 0 and len(query):
            found = space.retrieve(query, retrieve, cutoff)
            candidates += [(i, "answer" if i in space.answers else "retrieved") for i in found]
        chosen: list[Document] = []
        seen: set[str] = set()
        total = 0
        for doc_id, kind in candidates:
            entry = space.entries.get(doc_id)
            if entry is None or doc_id in seen or len(chosen) >= max_docs:
                continue
            if entry.last_used < cutoff:
                continue
            seen.add(doc_id)
            if total + entry.doc.bytes > max_bytes:
                continue
            total += entry.doc.bytes
            entry.last_used = now
            m = entry.meta()
            chosen.append(Document(**vars(m), text=space.blobs[entry.doc.sha256], kind=kind))
        return chosen

    async def delete(self, ns: str, doc_id: str, *, limits: Limits, now: float) -> bool:
        space = self._space(ns, limits, now)
        live = space.live(doc_id, now - limits.ttl_s)
        return space.remove(doc_id) and live

    async def list(self, ns: str, *, limits: Limits, now: float) -> builtins.list[DocumentMeta]:
        space = self._space(ns, limits, now)
        cutoff = now - limits.ttl_s
        return [
            space.entries[i].meta() for i in reversed(space.lru_order()) if space.live(i, cutoff)
        ]

    async def get_tokens(
        self, ns: str, fingerprint: str, shas: Sequence[str]
    ) -> builtins.list[bytes | None]:
        space = self._space(ns, None, None)
        return [space.tokens.get((fingerprint, sha)) for sha in shas]

    async def put_tokens(
        self, ns: str, fingerprint: str, arrays: Mapping[str, bytes], *, limits: Limits
    ) -> None:
        space = self._space(ns, None, None)
        for sha, data in arrays.items():
            if sha in space.refs:
                space.tokens[(fingerprint, sha)] = data

    async def anchor_key(self, ns: str, *, limits: Limits, create: bool) -> bytes | None:
        return self._spaces.setdefault(ns, _Namespace()).anchor_key

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
