"""Names a prompt may use to mention a document: its id, its path and their file names."""

from __future__ import annotations

import posixpath
import re

MAX_CANDIDATES = 512
MAX_SCAN_CHARS = 64 << 10  # the prompt's last characters scanned (where the request is)

_TOKEN = re.compile(r"[^\s\"'`()<>\[\]{},;|]+")
_ALNUM = re.compile(r"[^\W_]")  # a letter or digit (``str.isalnum``)
_TRAILING = ".:!?"


def document_names(doc_id: str, path: str | None) -> tuple[str, ...]:
    """The id, the path, and the base names of both when they look like file names."""
    names = [doc_id]
    for full in (doc_id, path):
        if not full:
            continue
        base = posixpath.basename(full)
        names += [full, base] if _looks_like_file(base) and base != full else [full]
    return tuple(dict.fromkeys(names))


def mention_candidates(
    prompt: str, limit: int = MAX_CANDIDATES, max_chars: int = MAX_SCAN_CHARS
) -> list[str]:
    """Distinct words of the prompt's last ``max_chars`` characters that could be a
    document name, path-like ones first.

    A "word" is delimited by whitespace, quotes, brackets and ``,;|``; trailing sentence
    punctuation is tried both kept and stripped, paths also contribute their file name, and
    words without a letter or digit are left out.
    Ids containing those delimiters can only be selected explicitly.
    """
    pathlike: dict[str, None] = {}
    plain: dict[str, None] = {}
    # split and deduplicated in C first: a prompt repeating one word costs one step
    for word in dict.fromkeys(_TOKEN.findall(prompt, max(0, len(prompt) - max_chars))):
        stripped = word.rstrip(_TRAILING)
        base = stripped.rpartition("/")[2]  # posixpath.basename
        for w in (word, stripped, base):
            if w in pathlike or w in plain or not _ALNUM.search(w):
                continue
            (pathlike if ("/" in w or ("." in w and _looks_like_file(w))) else plain)[w] = None
        if len(pathlike) >= limit:
            break
    return (list(pathlike) + list(plain))[:limit]


def _looks_like_file(name: str) -> bool:
    stem, ext = posixpath.splitext(name)
    return bool(stem) and len(ext) > 1
