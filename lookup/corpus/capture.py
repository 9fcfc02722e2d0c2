"""What to capture from a request and its response: fenced code blocks and answer texts."""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lookup.corpus.documents import content_sha256

_LANG = re.compile(r"[ \t]*([\w+#.-]*)")


@dataclass(frozen=True)
class CaptureLimits:
    """Bounds on what one capture call stores and how long it may take."""

    max_items: int = 8
    min_bytes: int = 16
    max_bytes: int = 64 * 1024
    max_scan_chars: int = 256 * 1024  # only this much of each request text is searched
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


def _fence(line: str) -> str:
    """The run of three or more backticks or tildes that opens ``line``, or ""."""
    if not line.startswith(("```", "~~~")):
        return ""
    return line[: len(line) - len(line.lstrip(line[0]))]


def code_blocks(text: str) -> list[tuple[str | None, str]]:
    """(language or None, body) of each fenced code block in a Markdown text.

    A block opens on a line starting with a fence (3+ backticks or tildes, then an optional
    language) and closes at the next line holding exactly that fence; an opener that is
    never closed is skipped. One pass over the lines plus a binary search per opener, so
    the cost is O(n log n) in the text's length whatever it holds.
    """
    lines = text.split("\n")
    closers: dict[str, list[int]] = {}  # fence -> indexes of the lines that close it
    for i, line in enumerate(lines):
        fence = _fence(line)
        if fence and line.rstrip(" \t") == fence:
            closers.setdefault(fence, []).append(i)
    blocks: list[tuple[str | None, str]] = []
    i = 0
    while i < len(lines) - 1:
        fence = _fence(lines[i])
        ends = closers.get(fence) if fence else None
        k = bisect.bisect_right(ends, i) if ends else 0
        if not ends or k == len(ends):
            i += 1
            continue
        end = ends[k]
        lang = _LANG.match(lines[i], len(fence))
        body = "".join(line + "\n" for line in lines[i + 1 : end])
        blocks.append((lang.group(1) if lang and lang.group(1) else None, body))
        i = end + 1
    return blocks


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
        candidates += [
            (lang, body, False) for lang, body in code_blocks(text[: limits.max_scan_chars])
        ]
    for language, text, answer in candidates:
        size = len(text.encode("utf-8", "replace"))
        if not limits.min_bytes <= size <= limits.max_bytes:
            continue
        kind = "answer" if answer else "code"
        items.append(CaptureItem(f"{kind}:{content_sha256(text)[:24]}", text, language, answer))
        if len(items) >= limits.max_items:
            break
    return items
