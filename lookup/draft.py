"""A draft: a chain or a small tree of proposed next tokens, each with a score."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Source(IntEnum):
    """Where a draft node's token was copied from (also the priority order)."""

    PREDICTION = 0
    PROMPT = 1
    OUTPUT = 2
    DOCUMENT = 3  # a document the request named
    RETRIEVED = 4  # a document the corpus found by content
    ANSWER = 5  # an earlier captured answer
    CONVERSATION = 6  # a file the conversation shows, in the forms an edit writes it


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


_CHAIN_PARENTS = _read_only(np.arange(-1, 255, dtype=np.int32))  # sliced by chain drafts
_EMPTY_TOKENS = _read_only(np.zeros(0, np.int64))
_EMPTY_PARENTS = _read_only(np.zeros(0, np.int32))
_EMPTY_SCORES = _read_only(np.zeros(0, np.float32))
_EMPTY_SOURCE = _read_only(np.zeros(0, np.int8))


def depths(parents: Sequence[int] | np.ndarray) -> np.ndarray:
    """Depth of each node (int64): 1 for children of the root (parents precede children)."""
    out = np.zeros(len(parents), dtype=np.int64)
    for node, parent in enumerate(np.asarray(parents).tolist()):
        out[node] = 1 if parent < 0 else out[parent] + 1
    return out


@dataclass(slots=True)  # not frozen: a frozen init costs more than the rest of a chain
class Draft:
    """Draft nodes in topological order.

    ``tokens[i]`` is node i's token, ``parents[i]`` the index of its parent node (-1 = a
    child of the last committed token; parents always precede children), ``scores[i]`` the
    estimated probability that the whole path to node i is accepted (never above its
    parent's), ``source[i]`` a :class:`Source`. Siblings come in decreasing score order,
    the order in which a verifier should try them. Treat a draft as immutable: its
    arrays may be read-only views (of an index's tokens, of shared constants).
    """

    tokens: np.ndarray  # int64 [n]
    parents: np.ndarray  # int32 [n]
    scores: np.ndarray  # float32 [n]
    source: np.ndarray  # int8 [n]

    @staticmethod
    def empty() -> Draft:
        """A draft with no nodes."""
        return _EMPTY

    @staticmethod
    def copied_chain(tokens: np.ndarray, scores: np.ndarray, source: int) -> Draft:
        """A chain of int64 ``tokens`` and float32 ``scores`` copied from one ``source``."""
        n = len(tokens)
        if n >= len(_PARENT_VIEWS):
            parents = np.arange(-1, n - 1, dtype=np.int32)
            return Draft(tokens, parents, scores, np.full(n, source, np.int8))
        return Draft(tokens, _PARENT_VIEWS[n], scores, _SOURCE_VIEWS[source][n])

    @staticmethod
    def chain(tokens: list[int], scores: list[float], source: list[int]) -> Draft:
        """A chain: node i is the child of node i - 1."""
        n = len(tokens)
        return Draft(
            np.asarray(tokens, np.int64),
            np.arange(-1, n - 1, dtype=np.int32),
            np.asarray(scores, np.float32),
            np.asarray(source, np.int8),
        )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """True when every node is the child of the node before it (an empty draft too)."""
        return bool(np.array_equal(self.parents, np.arange(-1, len(self) - 1)))

    def depths(self) -> np.ndarray:
        """Depth of each node (int64): 1 for children of the last committed token."""
        return depths(self.parents)

    def check(self, vocab_size: int) -> None:
        """Raise ``ValueError`` unless parents precede children and ids are in the vocabulary."""
        n = len(self)
        if not (len(self.parents) == len(self.scores) == len(self.source) == n):
            raise ValueError("draft arrays differ in length")
        parents = self.parents.astype(np.int64)
        if n and not np.all((parents >= -1) & (parents < np.arange(n))):
            raise ValueError("a draft node's parent does not precede it")
        if n and not np.all((self.tokens >= 0) & (self.tokens < vocab_size)):
            raise ValueError(f"a draft token is outside the vocabulary [0, {vocab_size})")

    def subset(self, nodes: list[int]) -> Draft:
        """The draft restricted to ``nodes`` (sorted, closed under parents), re-indexed."""
        remap = {old: new for new, old in enumerate(nodes)}
        remap[-1] = -1
        idx = np.asarray(nodes, dtype=np.int64)
        parents = [remap[p] for p in self.parents[idx].tolist()]
        return Draft(
            self.tokens[idx].copy(),
            np.asarray(parents, np.int32),
            self.scores[idx].copy(),
            self.source[idx].copy(),
        )


_EMPTY = Draft(_EMPTY_TOKENS, _EMPTY_PARENTS, _EMPTY_SCORES, _EMPTY_SOURCE)
_SOURCES = [_read_only(np.full(len(_CHAIN_PARENTS), int(s), np.int8)) for s in Source]
_VIEWS = len(_CHAIN_PARENTS) + 1  # shorter chains take their parents and sources from lists
_PARENT_VIEWS = [_CHAIN_PARENTS[:n] for n in range(_VIEWS)]
_SOURCE_VIEWS = [[row[:n] for n in range(_VIEWS)] for row in _SOURCES]
