"""Turning observations into evidence, and evidence into a yes/no/unknown verdict."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sdk.wire.evidence import Evidence, EvidenceKind, Feature, Verdict

MAX_EVIDENCE = 20


def make(
    kind: EvidenceKind,
    source: str,
    verdict: Verdict,
    detail: str,
    values: dict[str, float] | None = None,
    observed_at: float | None = None,
    feature: Feature = "speculation",
) -> Evidence:
    """One piece of evidence, stamped now unless told otherwise."""
    return Evidence(
        kind=kind,
        feature=feature,
        source=source,
        verdict=verdict,
        detail=detail,
        values=values or {},
        observed_at=time.time() if observed_at is None else observed_at,
    )


def verdict(
    evidence: Iterable[Evidence], feature: Feature = "speculation"
) -> tuple[Verdict, Evidence | None]:
    """The newest decisive (yes/no) evidence about ``feature`` decides; with none, ``unknown``.

    A 200 answer is never turned into evidence by the probes, so an endpoint that ignores
    ``prediction`` can only reach ``no`` or ``unknown``.
    """
    decisive = [e for e in evidence if e.verdict != "unknown" and e.feature == feature]
    if not decisive:
        return "unknown", None
    newest = max(decisive, key=lambda e: e.observed_at)
    return newest.verdict, newest
