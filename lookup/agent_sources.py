"""Draft sources from the files an agent's conversation shows, in the forms its edits take.

A coding agent reads a file (a tool result, usually a numbered listing: Claude Code's
``N\\t<line>`` lines, ``cat -n`` or ``nl -ba`` output under Codex's short header) and the
model then writes an edit that repeats most of it in another form: JSON-escaped inside a
tool call's arguments (an ``Edit``'s ``old_string``/``new_string``, a ``Write``'s
``content``), as the context, removed and added lines of an ``apply_patch`` patch (a
leading space, ``-`` or ``+``), which Codex sends inside a shell command's JSON string
and so escaped as well, or as plain text (a code block, a heredoc). None of these forms
is in the prompt: the line numbers, the escapes and the prefixes break a prompt match at
every line. Here the file texts are recovered (numbers stripped) and spelt in each form;
one document per text holds every form's tokens one after the other (each form tokenized
on its own, as the model writes it), so the drafter's suffix match finds the form being
written and copies on in it. Drafting stays lossless whatever the sources: verification
keeps only the target's own tokens.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

MIN_LINES = 3  # a shorter run of numbered lines is not taken for a listing
MAX_TEXT_CHARS = 256 << 10  # recovered text offered per request, the newest texts first
CACHE_TOKENS = 8 << 20  # tokens kept by the shared cache (4 bytes each)

_NUMBERED = re.compile(r" *(\d+)(?:\t|\u2192)(.*)")  # cat -n / nl -ba (tab), or an arrow
_PREFIXES = ("", " ", "-", "+")  # plain text, then the three kinds of diff line


def listings(text: str) -> list[str]:
    """The file texts of the numbered listings in ``text``, numbers stripped: each a run of
    at least ``MIN_LINES`` lines numbered one after another (what comes around a run, a
    header or a note, is not part of it)."""
    out: list[str] = []
    run: list[str] = []
    last = -1
    for line in text.split("\n"):
        match = _NUMBERED.fullmatch(line)
        number = int(match.group(1)) if match else -1
        if match and (not run or number == last + 1):
            run.append(match.group(2))
        else:
            if len(run) >= MIN_LINES:
                out.append("\n".join(run) + "\n")
            run = [match.group(2)] if match else []
        last = number
    if len(run) >= MIN_LINES:
        out.append("\n".join(run) + "\n")
    return out


def spell(text: str, prefix: str = "", escaped: bool = False) -> str:
    """``text`` with ``prefix`` before each line and, when ``escaped``, as the inside of a
    JSON string (newlines as ``\\n``, quotes and backslashes escaped, non-ASCII as is)."""
    if prefix:
        lines = text.split("\n")
        last = lines.pop() if not lines[-1] else None  # a final newline gets no prefix
        text = "\n".join(prefix + line for line in lines)
        if last is not None:
            text += "\n"
    return json.dumps(text, ensure_ascii=False)[1:-1] if escaped else text


def forms(text: str, plain: bool = True) -> list[str]:
    """``text`` as an edit may write it: plain (unless ``plain`` is False: the prompt holds
    it so already), as context, removed and added diff lines, and each of those escaped."""
    out = [spell(text, prefix, escaped) for escaped in (False, True) for prefix in _PREFIXES]
    return out if plain else out[1:]


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def conversation_texts(messages: Iterable[Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """The file texts a conversation shows, newest first, each with whether its plain form
    is new to the prompt: every numbered listing (in any message; plain: yes), and a tool
    result without one as it is (plain: no). At most ``MAX_TEXT_CHARS`` in all, no repeats."""
    found: list[tuple[str, bool]] = []
    for message in messages:
        text = _content(message)
        if not text:
            continue
        recovered = listings(text)
        if recovered:
            found += [(t, True) for t in recovered]
        elif message.get("role") == "tool" and text.count("\n") + 1 >= MIN_LINES:
            found.append((text, False))
    out: list[tuple[str, bool]] = []
    seen: set[str] = set()
    budget = MAX_TEXT_CHARS
    for text, plain in reversed(found):
        if text in seen or len(text) > budget:
            continue
        seen.add(text)
        budget -= len(text)
        out.append((text, plain))
    return out


Encode = Callable[[str], Sequence[int]]


class AgentSources:
    """Conversation documents with their tokens cached (an agent re-sends its whole history
    each turn): LRU by tokenizer and text, at most ``max_tokens`` tokens; thread-safe."""

    def __init__(self, max_tokens: int = CACHE_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()

    def documents(
        self, messages: Iterable[Mapping[str, Any]], encode: Encode, fingerprint: str
    ) -> list[tuple[str, np.ndarray]]:
        """(key, uint32 token ids) per text of ``conversation_texts(messages)``: its forms'
        tokens (``encode``, the tokenizer ``fingerprint`` names) one after the other. The
        key names the tokenizer, the text and the forms: an index cache may key by it."""
        out = []
        for text, plain in conversation_texts(messages):
            digest = hashlib.sha256(f"{fingerprint}\0{int(plain)}\0{text}".encode()).hexdigest()
            key = f"agent-forms:{digest}"
            with self._lock:
                tokens = self._entries.get(key)
                if tokens is not None:
                    self._entries.move_to_end(key)
            if tokens is None:
                tokens = np.concatenate(
                    [np.asarray(encode(f), dtype=np.uint32) for f in forms(text, plain)]
                )
                tokens.flags.writeable = False
                self._put(key, tokens)
            out.append((key, tokens))
        return out

    def _put(self, key: str, tokens: np.ndarray) -> None:
        with self._lock:
            if key in self._entries or len(tokens) > self.max_tokens:
                return
            self._entries[key] = tokens
            self._tokens += len(tokens)
            while self._tokens > self.max_tokens:
                _, old = self._entries.popitem(last=False)
                self._tokens -= len(old)


_SHARED = AgentSources()


def conversation_documents(
    messages: Iterable[Mapping[str, Any]], encode: Encode, fingerprint: str
) -> list[tuple[str, np.ndarray]]:
    """:meth:`AgentSources.documents` on the process's shared cache: what an endpoint adds
    to a request's documents, with ``Source.CONVERSATION``, for chat ``messages`` (role and
    content)."""
    return _SHARED.documents(messages, encode, fingerprint)
