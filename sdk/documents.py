"""``client.documents``: the caller's cached documents at ``/v1/documents``.

Documents are texts the gateway drafts from (files of the project being edited, earlier
answers); an edit or chat names them with ``documents=[ids]``. They live in the API
key's namespace on the gateway.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from sdk._core import parse_body
from sdk.files import iter_files
from sdk.languages import language_for
from sdk.wire import DocumentIn, DocumentInfo, DocumentList

DEFAULT_MAX_DOC_BYTES = 1 << 20
"""``put_dir`` skips files larger than this (1 MiB)."""

Send = Callable[..., httpx.Response]
AsyncSend = Callable[..., Awaitable[httpx.Response]]


def _doc_path(doc_id: str) -> str:
    return "documents/" + quote(doc_id, safe="")


def _body(doc_id: str, text: str, path: str | None, language: str | None) -> dict[str, Any]:
    return DocumentIn(id=doc_id, text=text, path=path, language=language).model_dump(
        exclude_none=True
    )


def dir_documents(
    root: str | os.PathLike[str], max_bytes: int, *, include_secrets: bool = False
) -> Iterator[DocumentIn]:
    """The text files under ``root`` that ``.gitignore`` does not exclude, as documents.

    The id and path are the file's posix path relative to ``root``; binary files, files
    over ``max_bytes`` and, unless ``include_secrets``, files that usually hold
    credentials (``.env``, ``*.pem``, ``id_rsa*``, ...) are passed over (see ``sdk.files``).
    """
    if not Path(root).is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    for found in iter_files(root, max_bytes=max_bytes, include_secrets=include_secrets):
        if found.text is not None:
            yield DocumentIn(
                id=found.rel, text=found.text, path=found.rel, language=language_for(found.rel)
            )


class Documents:
    """Synchronous document calls (``Client.documents``)."""

    def __init__(self, send: Send) -> None:
        self._send = send

    def put(
        self, id: str, text: str, *, path: str | None = None, language: str | None = None
    ) -> DocumentInfo:
        """Store (or replace) a document."""
        response = self._send("POST", "documents", json=_body(id, text, path, language))
        return parse_body(response, DocumentInfo)

    def put_dir(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_DOC_BYTES,
        include_secrets: bool = False,
    ) -> builtins.list[DocumentInfo]:
        """Store every text file under ``path`` that ``.gitignore`` keeps (see ``dir_documents``)."""
        return [
            self.put(d.id, d.text, path=d.path, language=d.language)
            for d in dir_documents(path, max_bytes, include_secrets=include_secrets)
        ]

    def get(self, id: str) -> DocumentInfo:
        """One document, with its text; :class:`sdk.errors.NotFoundError` if there is none."""
        return parse_body(self._send("GET", _doc_path(id)), DocumentInfo)

    def list(self) -> builtins.list[DocumentInfo]:
        """The namespace's documents (metadata only)."""
        return parse_body(self._send("GET", "documents"), DocumentList).data

    def delete(self, id: str) -> None:
        """Delete a document; :class:`sdk.errors.NotFoundError` if there is none."""
        self._send("DELETE", _doc_path(id))


class AsyncDocuments:
    """Asynchronous document calls (``AsyncClient.documents``)."""

    def __init__(self, send: AsyncSend) -> None:
        self._send = send

    async def put(
        self, id: str, text: str, *, path: str | None = None, language: str | None = None
    ) -> DocumentInfo:
        """Store (or replace) a document."""
        response = await self._send("POST", "documents", json=_body(id, text, path, language))
        return parse_body(response, DocumentInfo)

    async def put_dir(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_DOC_BYTES,
        include_secrets: bool = False,
    ) -> builtins.list[DocumentInfo]:
        """Store every text file under ``path`` that ``.gitignore`` keeps (see ``dir_documents``)."""
        return [
            await self.put(d.id, d.text, path=d.path, language=d.language)
            for d in dir_documents(path, max_bytes, include_secrets=include_secrets)
        ]

    async def get(self, id: str) -> DocumentInfo:
        """One document, with its text; :class:`sdk.errors.NotFoundError` if there is none."""
        return parse_body(await self._send("GET", _doc_path(id)), DocumentInfo)

    async def list(self) -> builtins.list[DocumentInfo]:
        """The namespace's documents (metadata only)."""
        return parse_body(await self._send("GET", "documents"), DocumentList).data

    async def delete(self, id: str) -> None:
        """Delete a document; :class:`sdk.errors.NotFoundError` if there is none."""
        await self._send("DELETE", _doc_path(id))
