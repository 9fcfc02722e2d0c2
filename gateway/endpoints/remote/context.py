"""The committed tokens of one answer (prompt, then output) and their JSON array text,
kept in step so a round's request body costs the new tokens, not the whole context."""

from __future__ import annotations

import json
from collections.abc import Sequence

ENCODE_SLICE = 65_536  # ids per json.dumps call: the GIL is let go between slices


def _ids_text(ids: Sequence[int]) -> bytes:
    """``ids`` as the inside of a JSON array (no brackets)."""
    parts = [
        json.dumps(list(ids[i : i + ENCODE_SLICE]))[1:-1] for i in range(0, len(ids), ENCODE_SLICE)
    ]
    return ",".join(p for p in parts if p).encode()


class TokenIds:
    """A growing token sequence and its JSON text, appended to as tokens are committed."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = [int(t) for t in ids]
        self._text = bytearray(_ids_text(self.ids))

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        if self._text:
            self._text += b","
        self._text += _ids_text(ids)
        self.ids += ids

    def json(self, tail: Sequence[int] = ()) -> bytes:
        """The JSON array of the sequence followed by ``tail`` (a draft, sent once)."""
        extra = _ids_text(tail)
        sep = b"," if self._text and extra else b""
        return b"[" + bytes(self._text) + sep + extra + b"]"
