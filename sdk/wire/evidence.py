"""Wire type of one observation about whether speculation runs behind an endpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["yes", "no", "unknown"]
EvidenceKind = Literal["probe", "passive", "measured"]


class Evidence(BaseModel):
    """One observation about whether speculation runs behind an endpoint."""

    kind: EvidenceKind
    source: str = Field(description="what was looked at, e.g. 'vllm /metrics'")
    verdict: Verdict
    detail: str
    observed_at: float = Field(description="unix time of the observation")
    values: dict[str, float] = Field(default_factory=dict)
