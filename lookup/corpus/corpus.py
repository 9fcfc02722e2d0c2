"""`Corpus`: the documents drafts are copied from, per namespace (tenant), over a store."""

from __future__ import annotations

import asyncio
import builtins
import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from lookup.corpus.anchors import AnchorConfig, anchors, query_text
from lookup.corpus.capture import CaptureLimits, CaptureStats, capture_items
from lookup.corpus.documents import (
    Document,
    DocumentMeta,
    check_id,
    check_language,
    check_namespace,
    check_path,
    content_sha256,
    decode_text,
)
from lookup.corpus.errors import InvalidDocument, StoreUnavailable
from lookup.corpus.mentions import document_names, mention_candidates
from lookup.corpus.store import DocumentStore, Limits, NewDocument

log = logging.getLogger(__name__)

_NO_ANCHORS = np.zeros(0, np.uint64)

Encode = Callable[[str], Sequence[int]]

INLINE_ANCHOR_CHARS = 64 * 1024  # longer texts are anchored on a worker thread
INLINE_MENTION_CHARS = 4 * 1024  # longer prompts are scanned for mentions on a worker thread


class Corpus:
    """Documents per namespace with TTL, caps with LRU eviction, selection and capture.

    ``ttl_s``: a document unused for this long is gone. ``max_doc_bytes``: larger documents
    are refused. ``max_ns_bytes``/``max_ns_docs``: a namespace's caps on uploaded
    documents; ``max_captured_bytes``/``max_captured_docs``: its caps on captured answers
    and code blocks, apart (each kind evicts its own least recently used to fit, never the
    other's). ``select_max_docs``/``select_max_bytes`` bound what one
    request drafts from; ``select_max_ids`` bounds the ids one request may name (more is
    `InvalidDocument`, refused before the store is asked); ``retrieve_max_docs`` of the
    documents may be found by content (0: off), anchored as ``anchor_config`` says.
    ``clock`` gives wall-clock seconds (injectable for tests).
    """

    def __init__(
        self,
        store: DocumentStore,
        *,
        ttl_s: float = 86400.0,
        max_doc_bytes: int = 1 << 20,
        max_ns_bytes: int = 64 << 20,
        max_ns_docs: int = 10_000,
        max_captured_bytes: int = 8 << 20,
        max_captured_docs: int = 1000,
        select_max_docs: int = 16,
        select_max_bytes: int = 4 << 20,
        retrieve_max_docs: int = 8,
        anchor_config: AnchorConfig | None = None,
        select_max_ids: int = 64,
        capture_limits: CaptureLimits | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        caps = (max_doc_bytes, max_ns_bytes, max_ns_docs, max_captured_bytes, max_captured_docs)
        if ttl_s <= 0 or min(*caps, select_max_docs) < 1:
            raise ValueError("ttl_s, caps and selection bounds must be positive")
        if retrieve_max_docs < 0:
            raise ValueError("retrieve_max_docs must not be negative")
        if max_doc_bytes > max_ns_bytes:
            raise ValueError("max_doc_bytes must not exceed max_ns_bytes")
        self.store = store
        self.limits = Limits(
            ttl_s=ttl_s,
            max_ns_bytes=max_ns_bytes,
            max_ns_docs=max_ns_docs,
            max_captured_bytes=max_captured_bytes,
            max_captured_docs=max_captured_docs,
        )
        self.max_doc_bytes = max_doc_bytes
        self.select_max_docs = select_max_docs
        self.select_max_bytes = select_max_bytes
        self.retrieve_max_docs = retrieve_max_docs
        self.anchor_config = anchor_config or AnchorConfig()
        self.select_max_ids = select_max_ids
        self.capture_limits = capture_limits or CaptureLimits()
        self.capture_stats = CaptureStats()
        self._clock = clock
        self._pending: set[asyncio.Task[None]] = set()

    async def put(
        self,
        ns: str,
        id: str,
        text: str | bytes,
        *,
        path: str | None = None,
        language: str | None = None,
    ) -> DocumentMeta:
        """Store (or replace) a document. Raises `DocumentTooLarge`, `InvalidDocument`,
        `StoreUnavailable`."""
        return await self._put(ns, id, text, path=path, language=language, answer=False)

    def _document_anchors(self, text: str, keys: str, key: bytes) -> np.ndarray:
        """A document's anchors under the namespace's ``key``; an answer's also include its
        request's (``keys``)."""
        cfg = self.anchor_config
        found = anchors(text, cfg.window, cfg.max_anchors, key)
        if keys:
            asked = anchors(query_text(keys, "", cfg), cfg.window, cfg.max_query_anchors, key)
            found = np.union1d(found, asked)
        return found

    async def _query_anchors(self, ns: str, prompt_text: str, prediction_text: str) -> np.ndarray:
        """The query's anchors; none when the namespace has no anchor key (nothing indexed)."""
        key = await self.store.anchor_key(ns, limits=self.limits, create=False)
        if key is None:
            return _NO_ANCHORS
        cfg = self.anchor_config
        return anchors(
            query_text(prompt_text, prediction_text, cfg), cfg.window, cfg.max_query_anchors, key
        )

    async def _put(
        self,
        ns: str,
        doc_id: str,
        text: str | bytes,
        *,
        path: str | None,
        language: str | None,
        answer: bool,
        keys: str = "",
        captured: bool = False,
    ) -> DocumentMeta:
        check_namespace(ns)
        check_id(doc_id)
        check_path(path)
        check_language(language)
        decoded, size = decode_text(text, self.max_doc_bytes)
        key = await self.store.anchor_key(ns, limits=self.limits, create=True)
        if key is None:
            raise StoreUnavailable("document store gave no anchor key")
        if len(decoded) + len(keys) > INLINE_ANCHOR_CHARS:
            found = await asyncio.to_thread(self._document_anchors, decoded, keys, key)
        else:
            found = self._document_anchors(decoded, keys, key)
        names = document_names(doc_id, path)
        doc = NewDocument(
            id=doc_id,
            text=decoded,
            sha256=content_sha256(decoded),
            bytes=size,
            path=path,
            language=language,
            names=names,
            anchors=found,
            meta_bytes=sum(len(v.encode()) for v in (doc_id, path or "", language or "", *names)),
        )
        return await self.store.put(
            ns, doc, answer=answer, limits=self.limits, now=self._clock(), captured=captured
        )

    async def get(self, ns: str, id: str) -> Document | None:
        """The document, marked as used, or None."""
        docs = await self.store.select(
            check_namespace(ns),
            ids=[check_id(id)],
            names=[],
            recent=0,
            query=_NO_ANCHORS,
            retrieve=0,
            max_docs=1,
            max_bytes=self.limits.max_ns_bytes,
            limits=self.limits,
            now=self._clock(),
        )
        return docs[0] if docs else None

    async def delete(self, ns: str, id: str) -> bool:
        """Remove a document; False when there was none."""
        return await self.store.delete(
            check_namespace(ns), check_id(id), limits=self.limits, now=self._clock()
        )

    async def list(self, ns: str) -> builtins.list[DocumentMeta]:
        """The namespace's documents, most recently used first."""
        return await self.store.list(check_namespace(ns), limits=self.limits, now=self._clock())

    async def select(
        self,
        ns: str,
        *,
        ids: Sequence[str] = (),
        prompt_text: str = "",
        prediction_text: str = "",
        recent: int = 0,
    ) -> builtins.list[Document]:
        """Documents for one request, in one store round trip: ``ids`` in order, then
        documents whose id or path the prompt mentions, then the ``recent`` latest captured
        answers, then up to ``retrieve_max_docs`` documents and answers whose content the
        prompt or prediction shares most (``Document.kind`` says which way each came);
        deduplicated and bounded by ``select_max_docs``/``select_max_bytes``. A long prompt
        is scanned for mentions on a worker thread."""
        if len(ids) > self.select_max_ids:
            raise InvalidDocument(
                f"{len(ids)} document ids named; at most {self.select_max_ids} per request"
            )
        checked = [check_id(i) for i in ids]
        if len(prompt_text) > INLINE_MENTION_CHARS:
            names = await asyncio.to_thread(mention_candidates, prompt_text)
        else:  # a short prompt is scanned faster than a worker thread is handed one
            names = mention_candidates(prompt_text) if prompt_text else []
        retrieve = self.retrieve_max_docs if prompt_text or prediction_text else 0
        check_namespace(ns)
        query = await self._query_anchors(ns, prompt_text, prediction_text) if retrieve else None
        return await self.store.select(
            ns,
            ids=checked,
            names=names,
            recent=min(max(0, recent), self.select_max_docs),
            query=_NO_ANCHORS if query is None else query,
            retrieve=retrieve,
            max_docs=self.select_max_docs,
            max_bytes=self.select_max_bytes,
            limits=self.limits,
            now=self._clock(),
        )

    async def tokens(
        self, ns: str, docs: Sequence[Document], fingerprint: str, encode: Encode
    ) -> builtins.list[tuple[str, np.ndarray]]:
        """(content sha256, uint32 token ids) per document, tokenized once per tokenizer.

        Cached arrays come back in one round trip; new ones are encoded on a worker thread
        and cached.
        When the store is unavailable the documents are simply encoded.
        """
        shas = list(dict.fromkeys(d.sha256 for d in docs))
        cached: builtins.list[bytes | None]
        try:
            cached = await self.store.get_tokens(ns, fingerprint, shas)
        except StoreUnavailable:
            cached = [None] * len(shas)
        arrays = {  # an entry not a whole number of ids is corrupt: computed again
            sha: np.frombuffer(data, dtype="<u4").astype(np.uint32, copy=False)
            for sha, data in zip(shas, cached, strict=True)
            if data is not None and len(data) % 4 == 0
        }
        todo = list({d.sha256: d.text for d in docs if d.sha256 not in arrays}.items())
        if todo:  # tokenizing megabytes takes a while: not on the event loop
            encoded = await asyncio.to_thread(
                lambda: [np.asarray(encode(text), dtype=np.uint32) for _, text in todo]
            )
            arrays.update((sha, array) for (sha, _), array in zip(todo, encoded, strict=True))
        fresh = {sha: arrays[sha].astype("<u4").tobytes() for sha, _ in todo}
        if fresh:
            try:
                await self.store.put_tokens(ns, fingerprint, fresh, limits=self.limits)
            except StoreUnavailable:
                log.debug("token arrays not cached: store unavailable")
        return [(d.sha256, arrays[d.sha256]) for d in docs]

    async def capture(
        self, ns: str, texts: Sequence[str], *, request_texts: Sequence[str] = ()
    ) -> None:
        """Store response ``texts`` (as answers) and the code blocks of ``request_texts``
        in the namespace, in the background. Returns at once and never raises: the texts
        are scanned on a worker thread, outcomes are counted in ``capture_stats``, and each
        capture is bounded by ``capture_limits``."""
        try:
            if len(self._pending) >= self.capture_limits.max_pending:
                self.capture_stats.dropped += 1
                return
            task = asyncio.get_running_loop().create_task(
                self._store_captured(ns, texts, request_texts)
            )
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        except Exception:
            self.capture_stats.failed += 1
            log.debug("capture not started", exc_info=True)

    async def _store_captured(
        self, ns: str, texts: Sequence[str], request_texts: Sequence[str]
    ) -> None:
        try:
            async with asyncio.timeout(self.capture_limits.timeout_s):
                items = await asyncio.to_thread(
                    capture_items, texts, request_texts, self.capture_limits
                )
                keys = "\n".join(request_texts)
                for item in items:
                    await self._put(
                        ns,
                        item.id,
                        item.text,
                        path=None,
                        language=item.language,
                        answer=item.answer,
                        keys=keys if item.answer else "",
                        captured=True,
                    )
            self.capture_stats.stored += len(items)
        except Exception:
            self.capture_stats.failed += 1
            log.debug("capture failed", exc_info=True)

    async def drain(self) -> None:
        """Wait for captures still running (at shutdown, or in tests)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def aclose(self) -> None:
        """Finish pending captures and close the store."""
        await self.drain()
        await self.store.aclose()
