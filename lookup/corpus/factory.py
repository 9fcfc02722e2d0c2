"""`open_store`: a document store from a URL."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from lookup.corpus.breaker import CircuitBreaker
from lookup.corpus.memory_store import MemoryDocumentStore
from lookup.corpus.redis_store import RedisDocumentStore
from lookup.corpus.store import DocumentStore

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def open_store(
    url: str | None,
    *,
    prefix: str = "dg:",
    timeout_s: float = 0.05,
    cluster: bool = False,
    max_connections: int = 64,
    breaker: CircuitBreaker | None = None,
) -> DocumentStore:
    """The store a URL names; connects lazily.

    ``None``, ``""`` or ``memory://`` -> the in-memory store; ``redis://``, ``rediss://``,
    ``unix://`` -> one Redis server; ``redis+cluster://`` (or ``cluster=True``) -> Redis
    Cluster, starting from the node in the URL. ``timeout_s`` bounds every call (the
    socket connect, and the whole operation: the store cancels a call that outlasts it,
    which closes its connection); failed calls are not retried.
    """
    if not url or url == "memory://":
        return MemoryDocumentStore()
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a store URL: {url!r} (want redis://, redis+cluster:// or memory://)")
    options: dict[str, Any] = {
        "socket_timeout": None,  # per-socket timers would double the store's own
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "max_connections": max_connections,
    }
    client: Redis | RedisCluster
    if scheme in _CLUSTER_SCHEMES or cluster:
        base = _CLUSTER_SCHEMES.get(scheme, scheme)
        client = RedisCluster.from_url(f"{base}://{rest}", **options)
    elif scheme in ("redis", "rediss", "unix"):
        client = Redis.from_url(url, **options)
    else:
        raise ValueError(f"unsupported store URL scheme {scheme!r}")
    return RedisDocumentStore(client, prefix=prefix, timeout_s=timeout_s, breaker=breaker)
