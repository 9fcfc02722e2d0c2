"""The ``DRAFTGATE_*`` variables the product's code reads, found in its source, so the
environment page can be checked against them."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGES = ("gateway", "sdk", "lookup", "local_verifier")
SUFFIXES = (".py", ".cpp")
NAME = re.compile(r"\bDRAFTGATE_[A-Z0-9_]*[A-Z0-9]\b")


def variables_in_code(root: Path) -> set[str]:
    """Every ``DRAFTGATE_`` name written in the product packages' source."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            if path.suffix in SUFFIXES:
                found.update(NAME.findall(path.read_text(encoding="utf-8")))
    return found


def missing_from(page: str, root: Path) -> list[str]:
    """The variables the code reads that ``page`` (Markdown) does not name."""
    return sorted(name for name in variables_in_code(root) if f"`{name}" not in page)
