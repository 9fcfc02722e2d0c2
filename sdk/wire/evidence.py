"""Wire type of one observation about whether speculation (or prefix caching) runs behind
an endpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Verdict = Literal["yes", "no", "unknown"]
EvidenceKind = Literal["probe", "passive", "measured"]
Feature = Literal["speculation", "prefix_cache", "remote_verify"]


class Evidence(BaseModel):
    """One observation about whether a feature (speculation by default) runs behind an
    endpoint."""

    kind: EvidenceKind
    feature: Feature = "speculation"
    source: str = Field(description="what was looked at, e.g. 'vllm /metrics'")
    verdict: Verdict
    detail: str
    observed_at: float = Field(description="unix time of the observation")
    values: dict[str, float] = Field(default_factory=dict)
