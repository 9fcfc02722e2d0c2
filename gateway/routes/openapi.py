"""``GET /openapi.json``: the OpenAPI 3.1 description of every route.

Written by hand next to the routes (the completion routes are pure ASGI apps that
Starlette's schema generator cannot read); request bodies are the wire types' own JSON
schemas, so the description cannot drift from what the gateway validates. A test fuzzes
every operation listed here and checks that it lists every route the app serves.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.http.responses import json_response
from sdk.wire import (
    ChatCompletionRequest,
    CompletionRequest,
    CountTokensRequest,
    DocumentIn,
    MessagesRequest,
)
from sdk.wire.endpoints import AuditRequest
from sdk.wire.responses import ResponsesRequest

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": ["string", "null"]},
                "param": {"type": ["string", "null"]},
            },
        }
    },
}
# the Messages API's own error shape
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_BODIES: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    ResponsesRequest,
    MessagesRequest,
    CountTokensRequest,
    DocumentIn,
    AuditRequest,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _operation(
    summary: str,
    *,
    body: type[BaseModel] | None = None,
    ok: int = 200,
    media: str = "application/json",
    params: list[dict[str, Any]] | None = None,
    auth: bool = True,
    error: str = "Error",
) -> dict[str, Any]:
    described = "an Anthropic-style error" if error == "AnthropicError" else "an OpenAI-style error"
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {
            str(ok): {"description": "success", "content": {media: {}}},
            "default": {
                "description": described,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}
                },
            },
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    if params:
        operation["parameters"] = params
    if not auth:
        operation["security"] = []
    return operation


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def openapi_document() -> dict[str, Any]:
    """The description of every route."""
    _, top = models_json_schema(
        [(model, "validation") for model in _BODIES],
        ref_template="#/components/schemas/{model}",
    )
    schemas = {**top.get("$defs", {}), "Error": _ERROR, "AnthropicError": _ANTHROPIC_ERROR}
    chat_stream = "application/json (text/event-stream when stream is true)"
    return {
        "openapi": "3.1.0",
        "info": {"title": "draftgate", "version": "1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"gatewayKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"gatewayKey": []}],
        "paths": {
            "/v1/chat/completions": {
                "post": _operation(f"Chat completion; {chat_stream}", body=ChatCompletionRequest)
            },
            "/v1/completions": {
                "post": _operation(f"Text completion; {chat_stream}", body=CompletionRequest)
            },
            "/v1/responses": {
                "post": _operation(
                    "A response (OpenAI Responses API); text/event-stream when stream is true",
                    body=ResponsesRequest,
                )
            },
            "/v1/messages": {
                "post": _operation(
                    "A message (Anthropic Messages API); text/event-stream when stream is true",
                    body=MessagesRequest,
                    error="AnthropicError",
                )
            },
            "/v1/messages/count_tokens": {
                "post": _operation(
                    "A Messages request's prompt tokens",
                    body=CountTokensRequest,
                    error="AnthropicError",
                )
            },
            "/v1/responses/{response_id}": {
                "get": _operation("A stored response", params=[_path_param("response_id")]),
                "delete": _operation(
                    "Delete a stored response", params=[_path_param("response_id")]
                ),
            },
            "/v1/responses/{response_id}/input_items": {
                "get": _operation(
                    "A stored response's input items", params=[_path_param("response_id")]
                )
            },
            "/v1/models": {"get": _operation("The model names clients may send")},
            "/v1/documents": {
                "post": _operation("Store a document", body=DocumentIn, ok=201),
                "get": _operation("The tenant's documents"),
            },
            "/v1/documents/{doc_id}": {
                "get": _operation("One document with its text", params=[_path_param("doc_id")]),
                "delete": _operation("Delete a document", params=[_path_param("doc_id")]),
            },
            "/v1/endpoints": {"get": _operation("Speculation records of every endpoint")},
            "/v1/endpoints/probe": {
                "post": _operation("Probe every endpoint, then return the records (admin)")
            },
            "/v1/endpoints/{name}/memory": {
                "get": _operation("A local endpoint's memory", params=[_path_param("name")])
            },
            "/v1/audits": {"post": _operation("Run an audit of one endpoint", body=AuditRequest)},
            "/healthz": {"get": _operation("Liveness and local endpoints' state", auth=False)},
            "/metrics": {
                "get": _operation(
                    "Prometheus metrics", media="text/plain; version=0.0.4", auth=False
                )
            },
            "/openapi.json": {"get": _operation("This description", auth=False)},
        },
    }


def openapi_routes() -> list[Route]:
    """``GET /openapi.json``."""
    document = openapi_document()

    async def openapi(request: Request) -> Response:
        return json_response(document)

    return [Route("/openapi.json", openapi, methods=["GET"])]
