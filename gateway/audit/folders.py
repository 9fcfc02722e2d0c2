"""The audit directory (``audit_dir``): one folder per audit run holding what
:func:`~gateway.audit.report.write_outputs` wrote (``audit.json``, ``report.md``, plots),
named by the run's start time (UTC), its endpoint and a random suffix."""

from __future__ import annotations

import re
import secrets
import time
from functools import lru_cache
from pathlib import Path

from sdk.wire.endpoints import AuditResult

RESULT = "audit.json"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}")
"""A run folder's name: one path segment that cannot climb out of the directory."""


def new_name(endpoint: str, started_at: float | None = None) -> str:
    """A new run folder's name: ``YYYYmmdd-HHMMSS-<endpoint>-<6 hex digits>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started_at))
    return f"{stamp}-{endpoint}-{secrets.token_hex(3)}"


def result_path(audit_dir: Path, name: str) -> Path | None:
    """The ``audit.json`` of the run folder ``name``; None when ``name`` is no folder of
    ``audit_dir`` holding one."""
    if not NAME.fullmatch(name):
        return None
    path = audit_dir / name / RESULT
    return path if path.is_file() else None


def names(audit_dir: Path) -> list[str]:
    """Every run folder of ``audit_dir`` holding an ``audit.json`` (none when it is absent)."""
    try:
        folders = list(audit_dir.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(f.name for f in folders if result_path(audit_dir, f.name) is not None)


def load(path: Path) -> AuditResult:
    """The run written at ``path`` (every request's record included); OSError or
    ValueError when it cannot be read."""
    return AuditResult.model_validate_json(path.read_bytes())


def summary(path: Path) -> AuditResult:
    """The run at ``path`` without its records, read again only when the file changed."""
    stat = path.stat()
    return _summary(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _summary(path: str, mtime_ns: int, size: int) -> AuditResult:
    result = load(Path(path))
    result.records = []
    return result
