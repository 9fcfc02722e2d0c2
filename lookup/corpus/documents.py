"""Documents and their metadata; validation and content hashing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lookup.corpus.errors import DocumentTooLarge, InvalidDocument

MAX_ID_CHARS = 1024
MAX_NAMESPACE_CHARS = 1024
MAX_PATH_CHARS = 1024
MAX_LANGUAGE_CHARS = 64


@dataclass(frozen=True)
class DocumentMeta:
    """What is known about a stored document, without its text."""

    id: str
    sha256: str
    bytes: int
    path: str | None
    language: str | None
    created: float
    last_used: float


@dataclass(frozen=True)
class Document(DocumentMeta):
    """A stored document with its text, and how a selection chose it: ``named`` (by id or
    a name the prompt mentions), ``answer`` (a captured answer) or ``retrieved`` (by
    content)."""

    text: str
    kind: str = "named"


def content_sha256(text: str) -> str:
    """Hex sha256 of the text's UTF-8 bytes (the dedupe and token-cache key)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_name(value: object, what: str, max_chars: int) -> str:
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise InvalidDocument(f"{what} must be a string of 1..{max_chars} characters")
    check_encodable(value, what)
    return value


def check_encodable(value: str, what: str) -> str:
    """The string, or `InvalidDocument` when it cannot be UTF-8 (lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidDocument(f"{what} is not valid Unicode (lone surrogate)") from None
    return value


def check_namespace(ns: str) -> str:
    """The namespace, or `InvalidDocument` when it is empty, too long or not Unicode."""
    return _check_name(ns, "namespace", MAX_NAMESPACE_CHARS)


def check_id(doc_id: str) -> str:
    """The document id, or `InvalidDocument` when it is empty, too long or not Unicode."""
    return _check_name(doc_id, "document id", MAX_ID_CHARS)


def check_path(path: str | None) -> str | None:
    """The path (or None), or `InvalidDocument` when it is empty, too long or not Unicode."""
    return None if path is None else _check_name(path, "path", MAX_PATH_CHARS)


def check_language(language: str | None) -> str | None:
    """The language (or None), or `InvalidDocument` when it is empty, too long or not
    Unicode."""
    return None if language is None else _check_name(language, "language", MAX_LANGUAGE_CHARS)


def decode_text(text: str | bytes, max_bytes: int) -> tuple[str, int]:
    """(text, UTF-8 size) after checking encoding and size.

    Raises `InvalidDocument` for bytes that are not UTF-8 (or a str with lone surrogates)
    and `DocumentTooLarge` above ``max_bytes``.
    """
    try:
        if isinstance(text, bytes | bytearray | memoryview):
            raw = bytes(text)
            decoded = raw.decode("utf-8")
        elif isinstance(text, str):
            decoded, raw = text, text.encode("utf-8")
        else:
            raise InvalidDocument(f"document text must be str or bytes, not {type(text).__name__}")
    except (UnicodeDecodeError, UnicodeEncodeError) as exc:
        raise InvalidDocument(
            f"document text is not valid UTF-8: {exc.reason} at byte {exc.start}"
        ) from None
    if len(raw) > max_bytes:
        raise DocumentTooLarge(f"document is {len(raw)} bytes; the limit is {max_bytes} bytes")
    return decoded, len(raw)
