"""The document corpus drafts copy from: documents per namespace in Redis or in memory."""

from lookup.corpus.breaker import CircuitBreaker
from lookup.corpus.capture import CaptureLimits, CaptureStats
from lookup.corpus.corpus import Corpus
from lookup.corpus.documents import Document, DocumentMeta
from lookup.corpus.errors import (
    CorpusError,
    DocumentTooLarge,
    InvalidDocument,
    StoreFull,
    StoreUnavailable,
)
from lookup.corpus.factory import open_store
from lookup.corpus.memory_store import MemoryDocumentStore
from lookup.corpus.redis_store import RedisDocumentStore
from lookup.corpus.store import DocumentStore

__all__ = [
    "CaptureLimits",
    "CaptureStats",
    "CircuitBreaker",
    "Corpus",
    "CorpusError",
    "Document",
    "DocumentMeta",
    "DocumentStore",
    "DocumentTooLarge",
    "InvalidDocument",
    "MemoryDocumentStore",
    "RedisDocumentStore",
    "StoreFull",
    "StoreUnavailable",
    "open_store",
]
