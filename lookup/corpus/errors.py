"""Errors raised by the document corpus."""

from __future__ import annotations


class CorpusError(Exception):
    """Base class of every corpus error."""


class DocumentTooLarge(CorpusError):
    """A document is larger than the per-document cap."""


class InvalidDocument(CorpusError):
    """A document, id or namespace is malformed (empty id, invalid UTF-8, ...)."""


class StoreUnavailable(CorpusError):
    """The store did not answer within its time budget, failed, or its circuit is open."""


class StoreFull(StoreUnavailable):
    """The store is out of memory (Redis at ``maxmemory`` under ``noeviction``): nothing
    was written."""
