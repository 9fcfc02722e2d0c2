"""``/v1/documents``: a tenant's documents in the corpus (POST, GET list, GET/DELETE one)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.errors import (
    GatewayError,
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from gateway.http.asgi import declared_length, read_body
from gateway.http.responses import json_response
from gateway.http.validation import check_string_lengths, parse_json_async, validate
from gateway.limits import prompt_tokens
from gateway.runtime import Runtime
from lookup.corpus import (
    CorpusError,
    DocumentTooLarge,
    InvalidDocument,
    StoreFull,
    StoreUnavailable,
)
from sdk.languages import language_for
from sdk.wire import DocumentIn, DocumentInfo, DocumentList


def _info(doc: Any, with_text: bool = False) -> dict[str, Any]:
    info = DocumentInfo(
        id=doc.id,
        bytes=doc.bytes,
        sha256=doc.sha256,
        path=doc.path,
        language=doc.language,
        created=doc.created,
        last_used=doc.last_used,
        text=doc.text if with_text else None,
    )
    return info.model_dump(exclude_none=not with_text)


def _corpus_error(exc: CorpusError) -> GatewayError:
    if isinstance(exc, DocumentTooLarge):
        return PayloadTooLarge(str(exc), param="text")
    if isinstance(exc, InvalidDocument):
        return InvalidRequest(str(exc))
    if isinstance(exc, StoreFull):
        return InsufficientStorage(f"{exc}; nothing was stored")
    if isinstance(exc, StoreUnavailable):
        return ServiceUnavailable(f"document store unavailable: {exc}")
    return ServiceUnavailable("document store error")


def _check_lengths(raw: bytes) -> None:
    check_string_lengths(raw, DocumentIn)


def document_routes(runtime: Runtime) -> list[Route]:
    """The four document routes bound to ``runtime``."""

    async def create(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        await runtime.limiter.admit_upload(tenant)
        limit = runtime.settings.max_body_bytes
        length = request.headers.get("content-length", "").encode() or None
        declared = declared_length(length, limit)
        # the bytes sent count as tokens: declared ones before the body is read
        await runtime.limiter.charge(tenant, prompt_tokens(declared or 0))
        # an id, path or language too long to store is refused before it is parsed, as
        # soon as the body's start shows it
        raw = await read_body(
            request.receive,
            limit,
            length,
            runtime.settings.server.body_timeout_s,
            inspect=_check_lengths,
        )
        if declared is None:
            await runtime.limiter.charge(tenant, prompt_tokens(len(raw)))
        _check_lengths(raw)
        doc = validate(DocumentIn, await parse_json_async(raw))
        try:
            meta = await runtime.corpus.put(
                tenant,
                doc.id,
                doc.text,
                path=doc.path,
                language=doc.language or language_for(doc.path or doc.id),
            )
        except CorpusError as exc:
            raise _corpus_error(exc) from None
        return json_response(_info(meta), 201)

    async def list_documents(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        try:
            metas = await runtime.corpus.list(tenant)
        except CorpusError as exc:
            raise _corpus_error(exc) from None
        return json_response(
            DocumentList(data=[DocumentInfo(**_info(m)) for m in metas]).model_dump(
                exclude_none=True
            )
        )

    async def get_document(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        doc_id = request.path_params["doc_id"]
        try:
            doc = await runtime.corpus.get(tenant, doc_id)
        except CorpusError as exc:
            raise _corpus_error(exc) from None
        if doc is None:
            raise NotFound(f"no document {doc_id!r}", param="id")
        return json_response(_info(doc, with_text=True))

    async def delete_document(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        doc_id = request.path_params["doc_id"]
        try:
            deleted = await runtime.corpus.delete(tenant, doc_id)
        except CorpusError as exc:
            raise _corpus_error(exc) from None
        if not deleted:
            raise NotFound(f"no document {doc_id!r}", param="id")
        return json_response({"id": doc_id, "object": "document", "deleted": True})

    return [
        Route("/v1/documents", create, methods=["POST"]),
        Route("/v1/documents", list_documents, methods=["GET"]),
        Route("/v1/documents/{doc_id:path}", get_document, methods=["GET"]),
        Route("/v1/documents/{doc_id:path}", delete_document, methods=["DELETE"]),
    ]
