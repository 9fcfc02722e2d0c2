"""Test drafters and controllers with the interface of ``lookup``'s, for injecting drafts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lookup.draft import Draft


def make_draft(tokens: Sequence[int], parents: Sequence[int]) -> Draft:
    n = len(tokens)
    return Draft(
        np.asarray(tokens, np.int64),
        np.asarray(parents, np.int32),
        np.ones(n, np.float32),
        np.zeros(n, np.int8),
    )


class OracleDrafter:
    """Drafts from a known reference continuation, right or wrong on purpose.

    modes: ``right`` (the reference), ``partly`` (right, then wrong from the middle),
    ``random``, ``shifted`` (the reference one token ahead: plausible but wrong), ``wrong``
    (the reference with its first token replaced: never accepted),
    ``eos`` (right tokens with an EOS in the middle), ``tree`` (several candidates per
    depth, the right one last or missing), ``long`` (ignores ``max_tokens``).
    """

    def __init__(self, reference: Sequence[int], vocab: int, mode: str, eos: int, seed: int = 0):
        self.reference = list(reference)
        self.vocab = vocab
        self.mode = mode
        self.eos = eos
        self.rng = np.random.default_rng(seed)
        self.pos = 0  # committed output tokens so far
        self.calls = 0

    def extend(self, tokens: Sequence[int]) -> None:
        self.pos += len(tokens)

    def _ref(self, start: int, n: int) -> list[int]:
        out = self.reference[start : start + n]
        return out + self.rng.integers(0, self.vocab, n - len(out)).tolist()

    def _wrong(self, token: int) -> int:
        return (token + 1 + int(self.rng.integers(0, self.vocab - 1))) % self.vocab

    def propose(self, max_tokens: int, max_width: int = 1) -> Draft:
        self.calls += 1
        k = max_tokens
        if self.mode == "long":
            k = max_tokens + 50
        if k <= 0:
            return Draft.empty()
        right = self._ref(self.pos, k)
        if self.mode in ("right", "long"):
            tokens = right
        elif self.mode == "partly":
            cut = int(self.rng.integers(0, k))
            tokens = right[:cut] + [self._wrong(right[cut])] + right[cut + 1 :]
        elif self.mode == "random":
            tokens = self.rng.integers(0, self.vocab, k).tolist()
        elif self.mode == "shifted":
            tokens = self._ref(self.pos + 1, k)
        elif self.mode == "wrong":
            tokens = [self._wrong(right[0]), *right[1:]]
        elif self.mode == "eos":
            cut = int(self.rng.integers(0, k))
            tokens = right[:cut] + [self.eos] + right[cut + 1 :]
        elif self.mode == "tree":
            return self._tree(right, k)
        else:
            raise ValueError(self.mode)
        return make_draft(tokens, list(range(-1, len(tokens) - 1)))

    def _tree(self, right: list[int], k: int) -> Draft:
        """Depth 1: two wrong siblings, then the right one (or none every third call); the
        right branch continues as a chain with a wrong sibling at each depth."""
        tokens: list[int] = []
        parents: list[int] = []
        w1, w2 = self._wrong(right[0]), self._wrong(right[0])
        for t in (w1, w2):
            if t != right[0] and t not in tokens:
                tokens.append(t)
                parents.append(-1)
                tokens.append(int(self.rng.integers(0, self.vocab)))  # a child of the wrong one
                parents.append(len(tokens) - 2)
        if self.calls % 3 == 0:
            return make_draft(tokens[:k], parents[:k])
        parent = -1
        for depth, token in enumerate(right):
            if len(tokens) + 2 > k:
                break
            tokens.append(token)
            parents.append(parent)
            parent = len(tokens) - 1
            if depth + 1 < len(right) and right[depth + 1] != self._wrong(right[depth + 1]):
                tokens.append(self._wrong(right[depth + 1]))  # a wrong sibling of the next
                parents.append(parent)
        n = min(k, len(tokens))
        return make_draft(tokens[:n], parents[:n])


class PassThrough:
    """A controller that asks for ``k`` tokens of width ``width`` and verifies all of it."""

    def __init__(self, k: int = 8, width: int = 1) -> None:
        self.k = k
        self.width = width
        self.observed: list[tuple[int, int]] = []

    def budget(self) -> tuple[int, int]:
        return self.k, self.width

    def choose(self, draft: Draft) -> Draft:
        return draft

    def observe(self, drafted: int, accepted: int) -> None:
        self.observed.append((drafted, accepted))
