"""Long JSON strings decoded and encoded a slice at a time, the event loop running
between slices: a body holding a prompt of megabytes holds other requests up for a
fraction of a millisecond at a time, not for the whole decode or encode (orjson holds
the GIL throughout a call, so a worker thread would not let the loop run meanwhile).

Decoding (:func:`cut_long_strings`, then :meth:`LongStrings.fill`): every string value
(not a key) whose literal spans at least ``SLICE_BYTES`` between its unescaped quotes is
cut out of the text, a placeholder string in its place; the rest (the skeleton) is
parsed whole, each long literal a slice at a time, and the placeholders replaced by the
decoded strings. A slice ends between two characters or escapes, never inside an escape,
a UTF-8 sequence or a surrogate pair, so the slices decode to the literal's string
exactly when the whole literal is valid JSON. The skeleton has the text's brackets,
keys and every other value, so what it holds is checked as strictly as the text would
be, and it is valid JSON with each placeholder a string value only where the text is.

Encoding (:func:`dumps`): :func:`orjson.dumps`'s bytes, long strings (of at least
``SLICE_BYTES`` characters) encoded a slice of characters at a time.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from typing import Any

import numpy as np
import orjson

SLICE_BYTES = 256 * 1024  # a literal (or string) this long goes in slices of this size
WALK_SLICE = 4096  # values walked between two turns of the event loop
_BLOCK = 1 << 20  # bytes compared at a time when looking for quotes
_QUOTE, _BACKSLASH, _U = b'"\\u'
_LOW = (b"dc", b"dd", b"de", b"df")  # \uDC00-\uDFFF: a surrogate pair's second half
_BACK = 16  # a valid literal's content has a place to cut within this many bytes
_KEY_END = re.compile(rb"[ \t\n\r]*:")  # what follows a key's closing quote
# a string no client can send by chance: it names a cut-out literal in the skeleton
_MARK = "draftgate-long-string-" + secrets.token_hex(8) + "-"


def _positions(view: np.ndarray, byte: int) -> np.ndarray:
    """Where ``byte`` is in ``view``, compared a block at a time (no temporary array the
    size of a long text)."""
    if view.size <= _BLOCK:
        return np.flatnonzero(view == byte)
    return np.concatenate(
        [np.flatnonzero(view[i : i + _BLOCK] == byte) + i for i in range(0, view.size, _BLOCK)]
    )


def real_quotes(view: np.ndarray) -> np.ndarray:
    """Positions of the quotes of a JSON text that open or close a string: those that no
    odd run of backslashes precedes."""
    quotes = _positions(view, _QUOTE)
    after = quotes[quotes > 0]
    maybe = after[view[after - 1] == _BACKSLASH]
    if maybe.size == 0:
        return quotes
    slashes = _positions(view, _BACKSLASH)
    first = np.ones(slashes.size, bool)
    first[1:] = np.diff(slashes) != 1
    run_start = np.maximum.accumulate(np.where(first, slashes, 0))
    before = maybe - 1
    odd = (before - run_start[np.searchsorted(slashes, before)]) % 2 == 0
    return np.setdiff1d(quotes, maybe[odd], assume_unique=True)


class LongStrings:
    """A JSON text's long string values cut out: ``skeleton`` is the text with a
    placeholder for each, ``spans`` their literals' contents (start and end in the text)."""

    def __init__(self, raw: bytes, skeleton: bytes, spans: list[tuple[int, int]]) -> None:
        self.raw = raw
        self.skeleton = skeleton
        self.spans = spans

    async def fill(self, data: Any) -> Any:
        """``data`` (the skeleton decoded) with each placeholder the string it stands
        for, each literal decoded a slice at a time (:class:`orjson.JSONDecodeError`
        where one is not a valid JSON string)."""
        strings = [await decode_literal(self.raw, start, end) for start, end in self.spans]
        pending, seen = [data], 0
        while pending:
            value = pending.pop()
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(item, str):
                    if item.startswith(_MARK):
                        value[key] = strings[int(item[len(_MARK) :])]
                elif isinstance(item, dict | list):
                    pending.append(item)
            seen += len(value)
            if seen >= WALK_SLICE:
                seen = 0
                await asyncio.sleep(0)
        return data


def cut_long_strings(raw: bytes) -> LongStrings | None:
    """``raw``'s long string values cut out (None: it has none, or its quotes do not pair,
    which leaves the error to the whole text's parse)."""
    quotes = real_quotes(np.frombuffer(raw, np.uint8))
    if quotes.size % 2:
        return None
    opens, closes = quotes[0::2], quotes[1::2]
    spans = [
        (int(opens[i]) + 1, int(closes[i]))
        for i in np.flatnonzero(closes - opens - 1 >= SLICE_BYTES)
        if not _KEY_END.match(raw, int(closes[i]) + 1)
    ]
    if not spans:
        return None
    parts: list[bytes] = []
    at = 0
    for k, (start, end) in enumerate(spans):
        parts += [raw[at:start], (_MARK + str(k)).encode()]
        at = end
    parts.append(raw[at:])
    return LongStrings(raw, b"".join(parts), spans)


async def decode_literal(raw: bytes, start: int, end: int) -> str:
    """The string whose JSON literal's content is ``raw[start:end]``, decoded a slice at
    a time, the event loop running between slices."""
    pieces: list[str] = []
    at = start
    while at < end:
        cut = _cut(raw, at + SLICE_BYTES, at, end) if end - at > SLICE_BYTES else end
        pieces.append(orjson.loads(b'"' + raw[at:cut] + b'"'))
        at = cut
        await asyncio.sleep(0)
    return "".join(pieces)


def _cut(raw: bytes, p: int, lo: int, end: int) -> int:
    """The place nearest before (else after) ``p`` where a slice of a literal's content
    ``raw[lo:end]`` may end: before a character or an escape, not within a surrogate
    pair. A valid content has one within ``_BACK`` bytes; where none is, the content is
    not valid, and ``p`` serves (one of the slices is refused, wherever they are cut)."""
    first, last = max(lo + 1, p - _BACK), min(end, p + _BACK)
    base = max(lo, first - 6)
    head = raw[lo:base]
    runs = {base: len(head) - len(head.rstrip(b"\\"))}  # backslashes ending raw[lo:q]
    for q in range(base + 1, last + 1):
        runs[q] = runs[q - 1] + 1 if raw[q - 1] == _BACKSLASH else 0

    def escape_at(j: int) -> bool:  # a backslash after an even run of them
        return raw[j] == _BACKSLASH and runs[j] % 2 == 0

    def cuttable(q: int) -> bool:
        if q == end:
            return True
        if raw[q] & 0xC0 == 0x80:  # a UTF-8 sequence's continuation
            return False
        for back in range(1, 6):  # inside an escape (a backslash, then one or five bytes)
            j = q - back
            if j >= base and escape_at(j) and (back == 1 or raw[j + 1] == _U):
                return False
        return not (  # a pair's second half: kept with its first
            escape_at(q) and raw[q + 1] == _U and raw[q + 2 : q + 4].lower() in _LOW
        )

    places = [*range(p, first - 1, -1), *range(p + 1, last + 1)]
    return next((q for q in places if cuttable(q)), p)


async def dumps(value: Any) -> bytes:
    """``orjson.dumps(value)``, its long strings encoded a slice at a time, the event
    loop running between slices (a value of more than ``WALK_SLICE`` values is encoded
    whole: looking for its long strings would cost the loop more)."""
    longs: list[str] = []
    try:
        shadow = _shadow(value, longs, [WALK_SLICE])
    except _TooMany:
        longs = []
    if not longs:
        return orjson.dumps(value)
    text = orjson.dumps(shadow)
    parts: list[bytes] = []
    at = 0
    for k, string in enumerate(longs):
        mark = b'"' + (_MARK + str(k)).encode() + b'"'
        found = text.index(mark, at)
        parts += [text[at:found], b'"']
        for piece in range(0, len(string), SLICE_BYTES):
            parts.append(orjson.dumps(string[piece : piece + SLICE_BYTES])[1:-1])
            await asyncio.sleep(0)
        parts.append(b'"')
        at = found + len(mark)
    parts.append(text[at:])
    return b"".join(parts)


class _TooMany(Exception):
    """A value holds more than ``WALK_SLICE`` values."""


def _shadow(value: Any, longs: list[str], left: list[int]) -> Any:
    """``value`` with each long string a placeholder (numbered in the order the encoding
    meets them, noted in ``longs``), containers copied only where one holds one;
    :class:`_TooMany` once more values than ``left[0]`` were met."""
    if isinstance(value, str):
        if len(value) < SLICE_BYTES:
            return value
        longs.append(value)
        return _MARK + str(len(longs) - 1)
    if isinstance(value, dict | list):
        left[0] -= len(value)
        if left[0] < 0:
            raise _TooMany
        before = len(longs)
        if isinstance(value, dict):
            copied: Any = {key: _shadow(item, longs, left) for key, item in value.items()}
        else:
            copied = [_shadow(item, longs, left) for item in value]
        return copied if len(longs) > before else value
    return value
