"""Token sequences drafts are copied from, each followed as the answer grows.

A :class:`Track` is a prediction or the gateway's documents: where the answer stands in it
(aligned from the answer's first token, or anchored where the answer's last tokens occur
longest), and the :class:`Edits` the answer made to it. When the answer leaves a track and
is found in it again a few tokens further, the tokens it skipped and those it wrote
instead are learned as an edit, and drafted wherever the same tokens come again (a rename
done once is drafted at each later use; one the answer does not repeat is dropped). An
:class:`AnswerTrack` is the answer itself: where its last tokens occurred earlier in it,
and what followed there (a repeated line, or a loop, drafted past the answer's end).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

SEPARATOR = -1
"""Ends each document; never a token, so no match crosses it."""
MIN_MATCH = 3
"""Context tokens a track must match where it is anchored (the index's n-gram)."""
MAX_CANDIDATES = 64
"""Occurrences of the last :data:`MIN_MATCH` tokens compared when anchoring."""
MAX_EDIT = 16
"""Tokens an edit learned from the answer may delete, and may insert."""
MAX_EDITS = 64
"""Edits learned per track."""


class Edit:
    """A change the answer made to a track: ``deleted`` tokens replaced by ``inserted``
    (an insertion keeps the token before it in both), with how often later places where
    ``deleted`` occurs went the same way (``hits``) or not (``misses``)."""

    __slots__ = ("deleted", "inserted", "hits", "misses")

    def __init__(self, deleted: tuple[int, ...], inserted: tuple[int, ...]) -> None:
        self.deleted = deleted
        self.inserted = inserted
        self.hits = 0
        self.misses = 0


class Edits:
    """The edits the answer made to one track, applied wherever their deleted tokens
    occur again further on."""

    def __init__(self) -> None:
        self._by_first: dict[int, list[Edit]] = {}
        self.count = 0

    def learn(self, deleted: tuple[int, ...], inserted: tuple[int, ...]) -> None:
        """Keep an edit the answer made (one seen again counts as a hit)."""
        same = self._by_first.setdefault(deleted[0], [])
        for edit in same:
            if edit.deleted == deleted and edit.inserted == inserted:
                edit.hits += 1
                return
        if self.count < MAX_EDITS:
            same.append(Edit(deleted, inserted))
            self.count += 1

    def at(self, tokens: Sequence[int], i: int) -> Edit | None:
        """The edit to apply where ``tokens[i:]`` starts with its deleted tokens: the one
        most often confirmed, the latest among equals; none that missed more than hit."""
        if i >= len(tokens):
            return None
        best: Edit | None = None
        for edit in self._by_first.get(tokens[i], ()):
            if edit.misses > edit.hits:
                continue
            n = len(edit.deleted)
            if tuple(tokens[i : i + n]) != edit.deleted:
                continue
            if best is None or edit.hits - edit.misses >= best.hits - best.misses:
                best = edit
        return best


class Track:
    """One token sequence drafts are copied from (with the answer's edits to it
    applied), and where the answer stands in it."""

    def __init__(self, tokens: list[int], position: int | None = None) -> None:
        self.tokens = tokens
        self.position = position
        """The index of the token expected next once ``pending`` is taken (None: the
        answer is not in this track)."""
        self.pending: list[int] = []
        """The inserted tokens of an edit being followed, expected before ``position``."""
        self.matched = 0
        """Answer tokens this track has matched in a row up to ``position``."""
        self.aligned = position is not None
        """Still aligned with the answer's start (a prediction never left)."""
        self.edits = Edits()
        self.lost: tuple[int, int] | None = None
        """Where the answer last left the track: (track index, answer index)."""
        self._edit: Edit | None = None
        self._site = (0, 0)
        self._index: dict[tuple[int, ...], list[int]] | None = None

    def follow(self, token: int, at: int) -> None:
        """Take the answer's next token (its index ``at`` in the answer): the track moves
        on (through an edit where one applies), or loses its place."""
        if self.position is None:
            return
        if not self.pending and self._edit is None:
            edit = self.edits.at(self.tokens, self.position)
            if edit is not None:
                self._edit, self._site = edit, (self.position, at)
                self.pending = list(edit.inserted)
                self.position += len(edit.deleted)
        expected = self.pending[0] if self.pending else self._token_at(self.position)
        if token != expected:
            if self._edit is not None:
                self._edit.misses += 1
                self._lose(*self._site)
            else:
                self._lose(self.position, at)
            return
        if self.pending:
            del self.pending[0]
        else:
            self.position += 1
        self.matched += 1
        if self._edit is not None and not self.pending:
            self._edit.hits += 1
            self._edit = None

    def anchor(self, tail: Sequence[int], answer: Sequence[int]) -> None:
        """Place the track after the longest occurrence of the context's last tokens
        ``tail`` (nearest after where the answer left it among equals, else the first);
        unplaced below :data:`MIN_MATCH`. Placed again after leaving, the answer's
        tokens in between and the track's it passed over are learned as an edit."""
        if len(tail) < MIN_MATCH:
            return
        tokens = self.tokens
        occurrences = self._occurrences().get(tuple(tail[-MIN_MATCH:]), [])
        near = self.lost[0] if self.lost is not None else None
        best, best_key = None, (0, 0)
        for end in self._candidates(occurrences, near):
            if end >= len(tokens) or tokens[end] == SEPARATOR:
                continue
            n = MIN_MATCH
            while n < len(tail) and n < end and tokens[end - n - 1] == tail[-n - 1]:
                n += 1
            key = (n, -_distance(end - n, near))
            if best is None or key > best_key:
                best, best_key = end, key
        if best is None:
            return
        self.position, self.matched = best, best_key[0]
        if self.lost is not None:
            self._learn(best - best_key[0], len(answer) - best_key[0], answer)
            self.lost = None

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens from the track's place with its edits applied, stopping at
        a document's end."""
        if self.position is None:
            return []
        out = self.pending[:k]
        tokens, i = self.tokens, self.position
        while len(out) < k and i < len(tokens):
            edit = self.edits.at(tokens, i)
            if edit is not None:
                out.extend(edit.inserted)
                i += len(edit.deleted)
                continue
            if tokens[i] == SEPARATOR:
                break
            out.append(tokens[i])
            i += 1
        return out[:k]

    def _candidates(self, occurrences: list[int], near: int | None) -> Sequence[int]:
        """The occurrences compared when anchoring: the first ones, or those around
        ``near``."""
        if near is not None and len(occurrences) > MAX_CANDIDATES:
            first = max(0, bisect.bisect_left(occurrences, near) - MAX_CANDIDATES // 4)
            return occurrences[first : first + MAX_CANDIDATES]
        return occurrences[:MAX_CANDIDATES]

    def _token_at(self, i: int) -> int | None:
        return self.tokens[i] if i < len(self.tokens) else None

    def _lose(self, position: int, at: int) -> None:
        self.position = None
        self.pending = []
        self._edit = None
        self.matched = 0
        self.aligned = False
        self.lost = (position, at)

    def _learn(self, start: int, answer_start: int, answer: Sequence[int]) -> None:
        """The edit between where the answer left the track and where it matched again
        (``start`` in the track, ``answer_start`` in the answer), when both are short."""
        assert self.lost is not None
        left, left_answer = self.lost
        if start < left or answer_start < left_answer:
            return
        deleted = tuple(self.tokens[left:start])
        inserted = tuple(answer[left_answer:answer_start])
        if len(deleted) > MAX_EDIT or len(inserted) > MAX_EDIT or SEPARATOR in deleted:
            return
        if not deleted:  # an insertion: applied after the token it follows
            if left == 0 or left_answer == 0 or self.tokens[left - 1] == SEPARATOR:
                return
            deleted = (self.tokens[left - 1],)
            inserted = (self.tokens[left - 1], *inserted)
        if deleted != inserted:
            self.edits.learn(deleted, inserted)

    def _occurrences(self) -> dict[tuple[int, ...], list[int]]:
        """Every :data:`MIN_MATCH`-gram of the track -> the positions right after it."""
        if self._index is None:
            index: dict[tuple[int, ...], list[int]] = {}
            tokens = self.tokens
            for end in range(MIN_MATCH, len(tokens) + 1):
                key = tuple(tokens[end - MIN_MATCH : end])
                if SEPARATOR not in key:
                    index.setdefault(key, []).append(end)
            self._index = index
        return self._index


class AnswerTrack(Track):
    """The answer itself: where its last tokens occurred earlier in it (the latest of the
    longest), and what followed there, repeated past the answer's end as a loop would."""

    def __init__(self, answer: list[int]) -> None:
        super().__init__(answer)
        self._index = {}
        self._indexed = MIN_MATCH - 1

    def draft(self, k: int) -> list[int]:
        if self.position is None:
            return []
        tokens, start = self.tokens, self.position
        out: list[int] = []
        for i in range(start, start + k):
            out.append(tokens[i] if i < len(tokens) else out[i - len(tokens)])
        return out

    def _candidates(self, occurrences: list[int], near: int | None) -> Sequence[int]:
        return occurrences[: -MAX_CANDIDATES - 1 : -1]

    def _learn(self, start: int, answer_start: int, answer: Sequence[int]) -> None:
        return  # the answer does not edit itself

    def _occurrences(self) -> dict[tuple[int, ...], list[int]]:
        index, tokens = self._index, self.tokens
        assert index is not None
        for end in range(self._indexed + 1, len(tokens) + 1):
            index.setdefault(tuple(tokens[end - MIN_MATCH : end]), []).append(end)
        self._indexed = len(tokens)
        return index


def _distance(start: int, near: int | None) -> int:
    """How far a match starting at ``start`` is past ``near`` (one before it: further)."""
    if near is None:
        return 0
    return start - near if start >= near else 1 << 30 | (near - start)
