"""The store interface both backends implement with identical semantics.

A store holds documents per namespace and enforces TTL, caps and LRU eviction itself, so
that every gateway replica sharing one Redis sees the same state. Each method is one round
trip to the backend; ``round_trips`` counts them.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lookup.corpus.documents import Document, DocumentMeta

PURGE_BATCH = 8  # expired documents one call removes at most (the rest count as gone)
RETRIEVE_SCAN = 4  # best matches looked at per document retrieval may return


@dataclass(frozen=True)
class Limits:
    """Per-namespace rules applied by every store operation."""

    ttl_s: float
    max_ns_bytes: int
    max_ns_docs: int
    max_captured_bytes: int = 8 << 20  # captured answers and code blocks, apart
    max_captured_docs: int = 1000


@dataclass(frozen=True)
class NewDocument:
    """A validated document to store: its text, hash, the names a prompt may mention and
    the anchors (``lookup.corpus.anchors``) retrieval finds it by.

    ``bytes`` is the text's UTF-8 size (counted once per distinct content);
    ``meta_bytes`` the UTF-8 size of its id, path, language and names (counted per
    document). Both count toward the namespace's byte cap, with the index's bytes.
    """

    id: str
    text: str
    sha256: str
    bytes: int
    path: str | None
    language: str | None
    names: tuple[str, ...]
    anchors: np.ndarray  # uint64, distinct
    meta_bytes: int = 0


class DocumentStore(Protocol):
    """Documents per namespace. A document unused for ``ttl_s`` is gone: every call removes
    up to ``PURGE_BATCH`` of them (oldest first) and skips the others."""

    round_trips: int

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
        """Store or replace a document (keeping its created time), evicting the least
        recently used of its kind to fit that kind's caps: uploaded documents within
        ``max_ns_docs``/``max_ns_bytes``, ``captured`` ones within the captured caps."""
        ...

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
        """Documents by id, then by mentioned name, then the ``recent`` latest answers, then
        the ``retrieve`` best matches of the ``query`` anchors.

        A match scores the sum, over the query anchors a document holds, of 1 / the number
        of documents holding that anchor; ties go to the newer document; of the
        ``retrieve * RETRIEVE_SCAN`` best, the first ``retrieve`` live ones. Deduplicated, in
        that order, skipping any that would pass ``max_docs`` or ``max_bytes``; the
        returned documents are marked used at ``now``.
        """
        ...

    async def delete(self, ns: str, doc_id: str, *, limits: Limits, now: float) -> bool: ...

    async def list(self, ns: str, *, limits: Limits, now: float) -> builtins.list[DocumentMeta]:
        """All live documents of the namespace, most recently used first."""
        ...

    async def get_tokens(
        self, ns: str, fingerprint: str, shas: Sequence[str]
    ) -> builtins.list[bytes | None]: ...

    async def put_tokens(
        self, ns: str, fingerprint: str, arrays: Mapping[str, bytes], *, limits: Limits
    ) -> None:
        """Cache token arrays of content that is stored in the namespace."""
        ...

    async def anchor_key(self, ns: str, *, limits: Limits, create: bool) -> bytes | None:
        """The namespace's secret anchor key (``lookup.corpus.anchors``), the same for every
        process sharing the store; with ``create`` one is made when there is none, else
        None then."""
        ...

    async def ping(self) -> None: ...

    async def aclose(self) -> None: ...
