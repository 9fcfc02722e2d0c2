"""Redis key layout.

Every key of a namespace starts with ``{prefix}{<tag>}:`` where ``<tag>`` is a hash of the
namespace: Redis Cluster hashes only the part between the braces, so all of a namespace's
keys live in one slot (scripts, pipelines and MGET stay legal), and no namespace, id or
name character ever reaches a key name (no key injection).

Keys under the namespace base ``B``:
  B + "lru"      ZSET   id-hash -> last used (LRU order, TTL purge)
  B + "ans"      ZSET   id-hash -> capture time of captured answers ("recent")
  B + "cap"      ZSET   id-hash -> capture time of every captured document (their own caps)
  B + "docs"     HASH   id-hash -> JSON metadata (id, sha256, bytes, meta_bytes, path, language,
                        created, names, num, captured)
  B + "names"    HASH   name-hash -> id-hash (ids, paths and basenames a prompt may mention)
  B + "refs"     HASH   sha256 -> number of documents holding that content (dedupe)
  B + "stat"     HASH   "bytes" -> bytes stored: distinct content + every document's metadata,
                        "axbytes" -> bytes the retrieval index is charged, "cbytes" ->
                        bytes of captured documents (content, metadata, index), "seq" ->
                        last document number given (rebuilt from "docs" when evicted)
  B + "fps"      SET    tokenizer-fingerprint hashes with cached token arrays
  B + "akey"     STRING the namespace's secret anchor key (16 random bytes, made on first
                        upload; every gateway sharing the Redis reads the same one)
  B + "ax"       HASH   anchor (6 bytes) -> postings (4-byte document numbers, at most
                        ``MAX_POSTINGS``; see lookup.corpus.anchors)
  B + "ad"       HASH   id-hash -> the document's indexed anchors (6 bytes each)
  B + "an"       HASH   document number (4 bytes) -> id-hash
  B + "b:" + sha256                    STRING  the content (UTF-8)
  B + "t:" + fingerprint-hash + ":" + sha256  STRING  token ids as little-endian uint32
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def digest(value: str) -> str:
    """A 128-bit hex digest naming a namespace, id, name or fingerprint inside keys."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def digests(values: Sequence[str]) -> str:
    """The ``digest`` of each value, concatenated (32 hex characters each)."""
    return b"".join(
        hashlib.sha256(v.encode("utf-8", "surrogatepass")).digest()[:16] for v in values
    ).hex()


def namespace_base(prefix: str, ns: str) -> str:
    """The common start of all of a namespace's keys, hash tag included."""
    return f"{prefix}{{{digest(ns)}}}:"


def tokens_key(base: str, fingerprint: str, sha256: str) -> str:
    return f"{base}t:{digest(fingerprint)}:{sha256}"


def index_key(base: str, name: str) -> str:
    """One of the namespace-wide keys ("lru", "ans", "docs", ...)."""
    return f"{base}{name}"
