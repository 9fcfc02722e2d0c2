"""Document wire types for ``/v1/documents``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DocumentIn(BaseModel):
    """Body of ``POST /v1/documents``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=1024)
    text: str
    path: str | None = Field(default=None, min_length=1, max_length=1024)
    language: str | None = Field(default=None, min_length=1, max_length=64)


class DocumentInfo(BaseModel):
    """A stored document's metadata (and text when asked for one document)."""

    id: str
    bytes: int
    sha256: str
    path: str | None = None
    language: str | None = None
    created: float
    last_used: float
    text: str | None = None


class DocumentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentInfo]
