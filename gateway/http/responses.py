"""Starlette responses for the routes off the hot path: JSON and OpenAI-style errors."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from gateway.errors import GatewayError


def error_response(error: GatewayError) -> Response:
    """An OpenAI-style error as a Starlette response."""
    return Response(
        error.body(), status_code=error.status, media_type="application/json", headers=error.headers
    )


def json_response(payload: Any, status: int = 200) -> Response:
    """``payload`` as a JSON response (non-ASCII kept as is)."""
    return Response(
        json.dumps(payload, ensure_ascii=False), status_code=status, media_type="application/json"
    )
