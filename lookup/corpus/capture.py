"""What to capture from a request and its response: fenced code blocks and answer texts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from lookup.corpus.documents import content_sha256


@dataclass(frozen=True)
class CaptureLimits:
    """Bounds on what one capture call stores and how long it may take."""

    max_items: int = 8
    min_bytes: int = 16
    max_bytes: int = 64 * 1024
    max_scan_chars: int = 64 * 1024  # only this much of each request text is searched
    max_fences: int = 16  # opening fence lines looked at in each request text
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


MAX_FENCE = 32  # a longer run of backticks or tildes opens no block
_OPENER = re.compile(
    rf"\n(`{{3,{MAX_FENCE}}}(?!`)|~{{3,{MAX_FENCE}}}(?!~))[ \t]*([\w+#.-]*)[^\n]*\n"
)


def _closer(fence: str) -> re.Pattern[str]:
    """A line holding exactly ``fence`` (then spaces or tabs), with the newline before it."""
    return re.compile("\n" + re.escape(fence) + r"[ \t]*(?=\n)")


def code_blocks(text: str, max_fences: int = 16) -> list[tuple[str | None, str]]:
    """(language or None, body) of each fenced code block in a Markdown text.

    A block opens on a line starting with a fence (3 to ``MAX_FENCE`` backticks or tildes,
    then an optional language) and closes at the next line holding exactly that fence; an opener that is
    never closed is skipped. Only regex searches in C read the text: each opener costs at
    most one search for its closer, a fence found unclosed is not searched for again, and
    at most ``max_fences`` openers are looked at, so the cost is linear in the text's
    length whatever it holds, with no Python step per line.
    """
    text = f"\n{text}\n"  # every line starts after a newline and ends at one
    closers: dict[str, re.Pattern[str] | None] = {}  # None: never closed after here
    blocks: list[tuple[str | None, str]] = []
    pos = 0
    for _ in range(max_fences):
        opener = _OPENER.search(text, pos)
        if opener is None:
            break
        fence, start = opener.group(1), opener.end()
        pos = start - 1  # the next line may open a block
        if fence not in closers:
            closers[fence] = _closer(fence)
        closer = closers[fence]
        end = closer.search(text, pos) if closer is not None else None
        if end is None:
            closers[fence] = None
            continue
        blocks.append((opener.group(2) or None, text[start : end.start() + 1]))
        pos = end.end()
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
            (lang, body, False)
            for lang, body in code_blocks(text[: limits.max_scan_chars], limits.max_fences)
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
