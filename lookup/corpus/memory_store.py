"""The embedded in-memory store: the same semantics as the Redis store, in one process."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lookup.corpus.documents import Document, DocumentMeta
from lookup.corpus.keys import digest
from lookup.corpus.store import Limits, NewDocument


@dataclass
class _Entry:
    doc: NewDocument
    created: float
    last_used: float
    order: str  # tie-break among equal times, as Redis sorted sets order members

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

    def remove(self, doc_id: str) -> bool:
        entry = self.entries.pop(doc_id, None)
        if entry is None:
            return False
        self.answers.pop(doc_id, None)
        self.stored_bytes -= entry.doc.meta_bytes
        self.drop_names(doc_id, entry)
        self.drop_ref(entry.doc)
        return True

    def purge(self, cutoff: float) -> None:
        for doc_id in [i for i, e in self.entries.items() if e.last_used < cutoff]:
            self.remove(doc_id)

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
        self, ns: str, doc: NewDocument, *, answer: bool, limits: Limits, now: float
    ) -> DocumentMeta:
        space = self._space(ns, limits, now)
        old = space.entries.get(doc.id)
        created = now
        if old is not None:
            created = old.created
            space.stored_bytes -= old.doc.meta_bytes
            space.drop_names(doc.id, old)
            if old.doc.sha256 != doc.sha256:
                space.drop_ref(old.doc)
                space.add_ref(doc)
        else:
            space.add_ref(doc)
        entry = _Entry(doc, created, now, digest(doc.id))
        space.entries[doc.id] = entry
        space.stored_bytes += doc.meta_bytes
        for name in doc.names:
            space.names[name] = doc.id
        if answer:
            space.answers[doc.id] = now
        for victim in space.lru_order():
            if (
                len(space.entries) <= limits.max_ns_docs
                and space.stored_bytes <= limits.max_ns_bytes
            ):
                break
            if victim != doc.id:
                space.remove(victim)
        return entry.meta()

    async def select(
        self,
        ns: str,
        *,
        ids: Sequence[str],
        names: Sequence[str],
        recent: int,
        max_docs: int,
        max_bytes: int,
        limits: Limits,
        now: float,
    ) -> list[Document]:
        space = self._space(ns, limits, now)
        candidates = list(ids) + [space.names[n] for n in names if n in space.names]
        if recent > 0:
            newest = sorted(
                space.answers,
                key=lambda i: (space.answers[i], space.entries[i].order),
                reverse=True,
            )
            candidates += newest[:recent]
        chosen: list[Document] = []
        seen: set[str] = set()
        total = 0
        for doc_id in candidates:
            entry = space.entries.get(doc_id)
            if entry is None or doc_id in seen or len(chosen) >= max_docs:
                continue
            seen.add(doc_id)
            if total + entry.doc.bytes > max_bytes:
                continue
            total += entry.doc.bytes
            entry.last_used = now
            m = entry.meta()
            chosen.append(Document(**vars(m), text=space.blobs[entry.doc.sha256]))
        return chosen

    async def delete(self, ns: str, doc_id: str, *, limits: Limits, now: float) -> bool:
        return self._space(ns, limits, now).remove(doc_id)

    async def list(self, ns: str, *, limits: Limits, now: float) -> builtins.list[DocumentMeta]:
        space = self._space(ns, limits, now)
        return [space.entries[i].meta() for i in reversed(space.lru_order())]

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

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
