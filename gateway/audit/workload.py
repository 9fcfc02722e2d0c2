"""Audit workloads: JSONL, one request per line.

Each line is an object with ``id`` and ``messages`` (OpenAI chat messages), and optionally
``category`` (one of ``CATEGORIES``, default ``chat``), ``max_tokens`` (default 256),
``prediction`` (the expected output, sent as OpenAI's ``prediction``), ``documents``
(``[{"id", "text"}]`` stored before the audit and named in the request), ``series`` (items
of a series run in file order, each naming the previous answers as documents), ``stop``
and ``language`` (detected from the script for ``multilingual`` items).
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = ("code_edit", "doc_qa", "json", "multilingual", "chat", "repeat")
BUILTIN_WORKLOAD = Path(__file__).with_name("default_workload.jsonl")

# first word of a Unicode character name -> language label for script-based detection
_SCRIPTS = {
    "HANGUL": "ko",
    "HIRAGANA": "ja",
    "KATAKANA": "ja",
    "CJK": "zh",
    "CYRILLIC": "ru",
    "ARABIC": "ar",
    "DEVANAGARI": "hi",
    "GREEK": "el",
    "HEBREW": "he",
    "THAI": "th",
}


@dataclass(frozen=True)
class WorkloadItem:
    """One request of the workload."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    max_tokens: int
    prediction: str | None = None
    documents: list[dict[str, str]] = field(default_factory=list)
    series: str | None = None
    stop: list[str] = field(default_factory=list)
    language: str | None = None


def detect_language(text: str) -> str:
    """A language label from the dominant non-Latin script (Japanese wins over shared CJK);
    ``latin`` when the text is Latin-script only."""
    scripts: Counter[str] = Counter()
    for ch in text:
        if ch.isalpha() and ord(ch) > 0x24F:
            word = unicodedata.name(ch, "").split(" ")[0]
            if word in _SCRIPTS:
                scripts[_SCRIPTS[word]] += 1
    if not scripts:
        return "latin"
    if scripts.get("ja"):
        return "ja"
    return scripts.most_common(1)[0][0]


def parse_item(raw: dict[str, Any]) -> WorkloadItem:
    """Validate one workload line (``ValueError`` names what is wrong)."""
    try:
        messages = raw["messages"]
        item_id = str(raw["id"])
    except KeyError as exc:
        raise ValueError(f"workload item lacks {exc.args[0]!r}") from None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"workload item {item_id}: `messages` must be a non-empty list")
    stop = raw.get("stop") or []
    language = raw.get("language")
    if language is None and raw.get("category") == "multilingual":
        language = detect_language(" ".join(str(m.get("content", "")) for m in messages))
    return WorkloadItem(
        id=item_id,
        category=str(raw.get("category") or "chat"),
        messages=messages,
        max_tokens=int(raw.get("max_tokens") or 256),
        prediction=raw.get("prediction"),
        documents=list(raw.get("documents") or []),
        series=raw.get("series"),
        stop=[stop] if isinstance(stop, str) else list(stop),
        language=language,
    )


def load_workload(path: str | Path | None = None) -> list[WorkloadItem]:
    """Read a workload file (the built-in one when ``path`` is None)."""
    source = Path(path) if path is not None else BUILTIN_WORKLOAD
    items = []
    for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(parse_item(json.loads(line)))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{source}:{n}: {exc}") from None
    if not items:
        raise ValueError(f"{source}: no workload items")
    return items


def in_categories(items: Sequence[WorkloadItem], categories: Collection[str]) -> list[WorkloadItem]:
    """The items of ``categories`` (every item when there are none); a category no item
    has is a ValueError."""
    if not categories:
        return list(items)
    have = sorted({item.category for item in items})
    unknown = sorted(set(categories) - set(have))
    if unknown:
        raise ValueError(f"no workload item in {', '.join(unknown)} (have: {', '.join(have)})")
    return [item for item in items if item.category in categories]
