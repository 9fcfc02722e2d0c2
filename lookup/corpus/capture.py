"""What to capture from a request and its response: fenced code blocks and answer texts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from lookup.corpus.documents import content_sha256

_FENCE = re.compile(
    r"^(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+#.-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True)
class CaptureLimits:
    """Bounds on what one capture call stores and how long it may take."""

    max_items: int = 8
    min_bytes: int = 16
    max_bytes: int = 64 * 1024
    max_scan_chars: int = 1 << 20  # longer request texts are not searched for code blocks
    timeout_s: float = 1.0
    max_pending: int = 64


@dataclass
class CaptureStats:
    """Counters of capture outcomes (captures never raise, so they are counted instead)."""

    stored: int = 0
    dropped: int = 0
    failed: int = 0


@dataclass(frozen=True)
class CaptureItem:
    id: str
    text: str
    language: str | None
    answer: bool


def code_blocks(text: str) -> list[tuple[str | None, str]]:
    """(language or None, body) of each fenced code block in a Markdown text."""
    return [(m.group("lang") or None, m.group("body")) for m in _FENCE.finditer(text)]


def capture_items(
    answers: Sequence[str], request_texts: Sequence[str], limits: CaptureLimits
) -> list[CaptureItem]:
    """Answers whole (marked as answers), then the requests' code blocks, within limits.

    Ids derive from the content hash, so capturing the same text again only refreshes it.
    """
    items: list[CaptureItem] = []
    if isinstance(answers, str):
        answers = [answers]
    candidates: list[tuple[str | None, str, bool]] = [(None, t, True) for t in answers]
    for text in request_texts:
        if len(text) <= limits.max_scan_chars:
            candidates += [(lang, body, False) for lang, body in code_blocks(text)]
    for language, text, answer in candidates:
        size = len(text.encode("utf-8", "replace"))
        if not limits.min_bytes <= size <= limits.max_bytes:
            continue
        kind = "answer" if answer else "code"
        items.append(CaptureItem(f"{kind}:{content_sha256(text)[:24]}", text, language, answer))
        if len(items) >= limits.max_items:
            break
    return items
