"""OpenAI-style error body: ``{"error": {"message", "type", "code", "param"}}``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str
    type: str
    code: str | None = None
    param: str | None = None


class ErrorResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    error: ErrorDetail
