"""The documented-speculation table: data in ``documented.toml``, matched by kind and model."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from sdk.wire.endpoints import DocumentedSpeculation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLE_PATH = Path(__file__).with_name("documented.toml")


@lru_cache(maxsize=4)
def load_table(path: Path = TABLE_PATH) -> tuple[DocumentedSpeculation, ...]:
    """Every row of the table, validated (a bad row names its field)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return tuple(DocumentedSpeculation.model_validate(row) for row in data.get("row", []))


def documented_for(
    kind: str, models: list[str], table: tuple[DocumentedSpeculation, ...] | None = None
) -> DocumentedSpeculation | None:
    """The row for an endpoint: its kind, and the first row whose model family matches one of
    its models (rows with no families match every model, so order them last)."""
    rows = load_table() if table is None else table
    for row in rows:
        if kind not in row.kinds:
            continue
        if not row.model_families:
            return row
        names = [m.lower() for m in models]
        if any(n.startswith(f.lower()) for n in names for f in row.model_families):
            return row
    return None
