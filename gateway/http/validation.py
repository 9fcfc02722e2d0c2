"""Request bodies into wire types: the one place a bad body becomes a 400.

Bad JSON is :class:`InvalidJSON` (``invalid_json``); a body that fails a wire type's
validation is :class:`InvalidRequest` (``invalid_field``) naming the first bad field.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidJSON, InvalidRequest

ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_json(raw: bytes) -> Any:
    """The decoded body; :class:`InvalidJSON` if it is not JSON."""
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None


def validate(model: type[ModelT], data: Any) -> ModelT:
    """``data`` as ``model``; :class:`InvalidRequest` naming the first bad field if not."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"{loc}: {first['msg']}", param=loc, code="invalid_field") from None
