"""``/v1/documents``: a tenant's documents in the corpus (POST, GET list, GET/DELETE one)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.asgi import read_body
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from gateway.json_body import read_object
from gateway.runtime import Runtime
from lookup.corpus import CorpusError, DocumentTooLarge, InvalidDocument, StoreUnavailable
from sdk.wire import DocumentIn, DocumentInfo, DocumentList


def error_response(error: GatewayError) -> Response:
    """An OpenAI-style error as a Starlette response."""
    return Response(
        error.body(), status_code=error.status, media_type="application/json", headers=error.headers
    )


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(payload, ensure_ascii=False), status_code=status, media_type="application/json"
    )


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
    if isinstance(exc, StoreUnavailable):
        return ServiceUnavailable(f"document store unavailable: {exc}")
    return ServiceUnavailable("document store error")


def document_routes(runtime: Runtime) -> list[Route]:
    """The four document routes bound to ``runtime``."""

    def tenant_of(request: Request) -> str:
        value = request.headers.get("authorization")
        return runtime.auth.tenant(value.encode("latin-1") if value is not None else None)

    async def create(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            raw = await read_body(
                request.receive,
                runtime.settings.max_body_bytes,
                request.headers.get("content-length", "").encode() or None,
            )
            data = await read_object(raw)
            try:
                doc = DocumentIn.model_validate(data)
            except ValidationError as err:
                first = err.errors()[0]
                loc = ".".join(str(p) for p in first["loc"]) or "body"
                raise InvalidRequest(
                    f"{loc}: {first['msg']}", param=loc, code="invalid_field"
                ) from None
            try:
                meta = await runtime.corpus.put(
                    tenant, doc.id, doc.text, path=doc.path, language=doc.language
                )
            except CorpusError as exc:
                raise _corpus_error(exc) from None
        except GatewayError as error:
            return error_response(error)
        return json_response(_info(meta), 201)

    async def list_documents(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            try:
                metas = await runtime.corpus.list(tenant)
            except CorpusError as exc:
                raise _corpus_error(exc) from None
        except GatewayError as error:
            return error_response(error)
        return json_response(
            DocumentList(data=[DocumentInfo(**_info(m)) for m in metas]).model_dump(
                exclude_none=True
            )
        )

    async def get_document(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            doc_id = request.path_params["doc_id"]
            try:
                doc = await runtime.corpus.get(tenant, doc_id)
            except CorpusError as exc:
                raise _corpus_error(exc) from None
            if doc is None:
                raise NotFound(f"no document {doc_id!r}", param="id")
        except GatewayError as error:
            return error_response(error)
        return json_response(_info(doc, with_text=True))

    async def delete_document(request: Request) -> Response:
        try:
            tenant = tenant_of(request)
            doc_id = request.path_params["doc_id"]
            try:
                deleted = await runtime.corpus.delete(tenant, doc_id)
            except CorpusError as exc:
                raise _corpus_error(exc) from None
            if not deleted:
                raise NotFound(f"no document {doc_id!r}", param="id")
        except GatewayError as error:
            return error_response(error)
        return json_response({"id": doc_id, "object": "document", "deleted": True})

    return [
        Route("/v1/documents", create, methods=["POST"]),
        Route("/v1/documents", list_documents, methods=["GET"]),
        Route("/v1/documents/{doc_id:path}", get_document, methods=["GET"]),
        Route("/v1/documents/{doc_id:path}", delete_document, methods=["DELETE"]),
    ]
