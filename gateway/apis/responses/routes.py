"""A tenant's stored responses: ``GET /v1/responses/{id}``, ``DELETE /v1/responses/{id}``
and ``GET /v1/responses/{id}/input_items`` (``limit`` 1-100, default 20; ``order``
``desc``, the default, or ``asc``; ``after`` an item id). Another tenant's id is a 404,
as an unknown one is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.apis.responses.door import ResponsesDoor
from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.http.responses import json_response
from lookup.corpus.errors import StoreUnavailable
from sdk.wire.responses import DeletedResponse, InputItemList

if TYPE_CHECKING:
    from gateway.runtime import Runtime

MAX_LIMIT = 100


def _limit(value: str | None) -> int:
    if value is None:
        return 20
    if not value.isdigit() or not 1 <= int(value) <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return int(value)


def response_routes(runtime: Runtime, door: ResponsesDoor) -> list[Route]:
    """The three routes over ``door``'s store, authenticated by ``runtime``."""

    async def get_response(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        stored = await door.stored(tenant, request.path_params["response_id"])
        return json_response(stored.response)

    async def delete_response(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        response_id = request.path_params["response_id"]
        try:
            deleted = await door.store.delete(tenant, response_id)
        except StoreUnavailable as exc:
            raise ServiceUnavailable(str(exc)) from None
        if not deleted:
            raise NotFound(f"no response with id {response_id!r}")
        return json_response(DeletedResponse(id=response_id).model_dump())

    async def input_items(request: Request) -> Response:
        tenant = runtime.auth.tenant(request.scope)
        query = request.query_params
        limit = _limit(query.get("limit"))
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("order must be asc or desc", param="order")
        stored = await door.stored(tenant, request.path_params["response_id"])
        items = stored.input if order == "asc" else stored.input[::-1]
        after = query.get("after")
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(f"after: no input item {after!r}", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        listed = InputItemList.model_validate(
            {
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )
        return json_response(listed.model_dump(mode="json"))

    return [
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", input_items, methods=["GET"]),
    ]
