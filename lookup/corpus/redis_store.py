"""The Redis store (single server or Redis Cluster) behind a time budget and a circuit breaker."""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeout

from lookup.corpus import redis_scripts
from lookup.corpus.anchors import KEY_BYTES, pack
from lookup.corpus.breaker import CircuitBreaker
from lookup.corpus.documents import Document, DocumentMeta
from lookup.corpus.errors import StoreFull, StoreUnavailable
from lookup.corpus.keys import digest, digests, index_key, namespace_base, tokens_key
from lookup.corpus.store import Limits, NewDocument

T = TypeVar("T")

# Keys outlive the TTL by this much, so the exact (lazy) purge always runs before Redis
# expires anything natively; native expiry only cleans up namespaces nobody uses any more.
EXPIRY_GRACE_S = 3600.0
# A process re-reads a namespace's anchor key this often, so replicas converge on one key
# within this time even after the key was lost (evicted, or expired with its namespace).
ANCHOR_KEY_REFRESH_S = 60.0
ANCHOR_KEY_CACHE = 4096  # namespaces whose anchor keys a process keeps


class RedisDocumentStore:
    """Documents in Redis; every operation is one round trip (a Lua script or one MGET).

    Failures and answers slower than ``timeout_s`` raise `StoreUnavailable`; after repeated
    failures the circuit breaker fails calls at once until its cool-down has passed.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = "dg:",
        timeout_s: float = 0.05,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.breaker = breaker or CircuitBreaker()
        self.round_trips = 0
        self._put = client.register_script(redis_scripts.PUT)
        self._select = client.register_script(redis_scripts.SELECT)
        self._delete = client.register_script(redis_scripts.DELETE)
        self._list = client.register_script(redis_scripts.LIST)
        self._put_tokens = client.register_script(redis_scripts.PUT_TOKENS)
        self._anchor_key = client.register_script(redis_scripts.ANCHOR_KEY)
        self._anchor_keys: dict[str, tuple[bytes, float]] = {}  # ns -> (key, read at)

    async def _call(self, request: Callable[[], Awaitable[T]]) -> T:
        if not self.breaker.allow():
            raise StoreUnavailable("document store circuit is open after repeated failures")
        self.round_trips += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await request()
        except OutOfMemoryError as exc:  # refused before the script wrote anything
            self.breaker.success()
            raise StoreFull("document store is full (Redis maxmemory reached)") from exc
        except (RedisError, OSError, TimeoutError) as exc:
            self.breaker.failure()
            timed_out = isinstance(exc, TimeoutError | RedisTimeout)
            reason = "timed out" if timed_out else type(exc).__name__
            raise StoreUnavailable(f"document store unavailable ({reason})") from exc
        self.breaker.success()
        return result

    def _script_args(self, ns: str, limits: Limits, now: float) -> tuple[list[str], list[Any]]:
        base = namespace_base(self.prefix, ns)
        expire_ms = int((limits.ttl_s + EXPIRY_GRACE_S) * 1000)
        return [index_key(base, "lru")], [base, repr(now), expire_ms, repr(now - limits.ttl_s)]

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
        keys, args = self._script_args(ns, limits, now)
        meta = {
            "id": doc.id,
            "sha256": doc.sha256,
            "bytes": doc.bytes,
            "meta_bytes": doc.meta_bytes,
            "path": doc.path,
            "language": doc.language,
            "names": [digest(n) for n in doc.names],
        }
        args += [
            digest(doc.id),
            json.dumps(meta, ensure_ascii=False),
            doc.text,
            "1" if answer else "0",
            limits.max_ns_docs,
            limits.max_ns_bytes,
            pack(doc.anchors),
            "1" if captured else "0",
            limits.max_captured_docs,
            limits.max_captured_bytes,
            self._anchor_keys.get(ns, (b"", 0.0))[0],
        ]
        created = await self._call(lambda: self._put(keys, args))
        return DocumentMeta(
            doc.id, doc.sha256, doc.bytes, doc.path, doc.language, float(created), now
        )

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
        keys, args = self._script_args(ns, limits, now)
        args += [max_docs, max_bytes, recent, retrieve, pack(query), digests(ids), digests(names)]
        reply = await self._call(lambda: self._select(keys, args))
        docs = []
        for i in range(0, len(reply), 8):
            doc_id, sha, size, path, language, created, text, kind = reply[i : i + 8]
            if text is not None:
                docs.append(
                    Document(
                        doc_id.decode(),
                        sha.decode(),
                        size,
                        None if path is None else path.decode(),
                        None if language is None else language.decode(),
                        float(created),
                        now,
                        text.decode(),
                        kind.decode(),
                    )
                )
        return docs

    async def delete(self, ns: str, doc_id: str, *, limits: Limits, now: float) -> bool:
        keys, args = self._script_args(ns, limits, now)
        args.append(digest(doc_id))
        return bool(await self._call(lambda: self._delete(keys, args)))

    async def list(self, ns: str, *, limits: Limits, now: float) -> builtins.list[DocumentMeta]:
        keys, args = self._script_args(ns, limits, now)
        reply = await self._call(lambda: self._list(keys, args))
        return [_meta(raw, score) for raw, score in zip(reply[0::2], reply[1::2], strict=True)]

    async def get_tokens(
        self, ns: str, fingerprint: str, shas: Sequence[str]
    ) -> builtins.list[bytes | None]:
        if not shas:
            return []
        base = namespace_base(self.prefix, ns)
        keys = [tokens_key(base, fingerprint, sha) for sha in shas]
        values = await self._call(lambda: self.client.mget(keys))
        return [v.encode() if isinstance(v, str) else v for v in values]

    async def put_tokens(
        self, ns: str, fingerprint: str, arrays: Mapping[str, bytes], *, limits: Limits
    ) -> None:
        if not arrays:
            return
        keys, args = self._script_args(ns, limits, 0.0)
        args.append(digest(fingerprint))
        for sha, data in arrays.items():
            args += [sha, data]
        await self._call(lambda: self._put_tokens(keys, args))

    async def anchor_key(self, ns: str, *, limits: Limits, create: bool) -> bytes | None:
        now = time.monotonic()
        cached = self._anchor_keys.get(ns)
        if cached is not None and now - cached[1] < ANCHOR_KEY_REFRESH_S:
            return cached[0]
        base = namespace_base(self.prefix, ns)
        expire_ms = int((limits.ttl_s + EXPIRY_GRACE_S) * 1000)
        args: list[bytes | int | str] = [os.urandom(KEY_BYTES), expire_ms, "1" if create else "0"]
        key = await self._call(lambda: self._anchor_key([index_key(base, "akey")], args))
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            return None
        self._anchor_keys.pop(ns, None)
        if len(self._anchor_keys) >= ANCHOR_KEY_CACHE:  # the oldest read goes
            del self._anchor_keys[next(iter(self._anchor_keys))]
        self._anchor_keys[ns] = (key, now)
        return key

    async def ping(self) -> None:
        await self._call(self.client.ping)

    async def aclose(self) -> None:
        await self.client.aclose()


def _meta(raw: bytes, last_used: bytes) -> DocumentMeta:
    m = json.loads(raw)
    return DocumentMeta(
        m["id"],
        m["sha256"],
        int(m["bytes"]),
        m.get("path"),
        m.get("language"),
        float(m["created"]),
        float(last_used),
    )
