"""Structured output: a grammar's token mask, part of the target distribution (llguidance).

A request with a grammar samples from the target's logits with every token the grammar
forbids after the tokens so far set to ``-inf`` (before temperature, min-p, top-k and
top-p, after the penalties). Plain decoding masks the one row after the committed tokens;
a verify step masks row ``i + 1`` with the state after the committed tokens plus the draft
path from the root to node ``i``, so row for row the same mask meets the same logits and
the result is bitwise that of plain decoding. Draft nodes the grammar forbids are cut from
the draft before the forward pass (:meth:`Constraint.prune`). One llguidance matcher per
request follows the committed tokens; a step moves it along draft paths with its
``rollback`` and returns it. docs/structured-output.md says why llguidance.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer

from local_verifier.tokenizer import Tokenizer
from lookup.draft import Draft

# between JSON tokens: bounded, so a sampled answer cannot spend its tokens on whitespace
WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"


def json_grammar(schema: Mapping[str, Any] | None) -> str:
    """The grammar of JSON matching ``schema`` (None: any JSON object).

    Raises ``ValueError`` naming what is wrong when the schema cannot be compiled.
    """
    spec = {"type": "object"} if schema is None else dict(schema)
    try:
        grammar = LLMatcher.grammar_from_json_schema(
            spec, overrides={"whitespace_pattern": WHITESPACE}
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"invalid JSON schema: {exc}") from None
    error = _error(grammar)
    if error:
        raise ValueError(f"invalid JSON schema: {error}")
    return grammar


def check_grammar(grammar: str) -> None:
    """Raise ``ValueError`` unless ``grammar`` (llguidance's format) compiles."""
    error = _error(grammar)
    if error:
        raise ValueError(f"invalid grammar: {error}")


def _error(grammar: str) -> str:
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return (messages[0] if messages else "rejected") if is_error else ""


class GrammarCompiler:
    """Builds request matchers for one tokenizer; its token index is built on first use."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll: LLTokenizer | None = None

    def constraint(self, grammar: str) -> Constraint:
        """A fresh matcher for ``grammar`` (checked with :func:`check_grammar`)."""
        if self._ll is None:
            eos = sorted(self.tokenizer.eos_ids)
            if not eos:  # the grammar ends the answer with one
                raise ValueError("structured output needs a tokenizer with an end-of-sequence id")
            self._ll = LLTokenizer(
                self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=eos
            )
        matcher = LLMatcher(self._ll, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid grammar: {matcher.get_error()}")
        return Constraint(matcher, self.vocab_size, self.tokenizer.eos_ids)


class Constraint:
    """One request's grammar state: its committed tokens and, within a step, a draft path."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, eos_ids: Set[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.seconds = 0.0  # time spent in the grammar (pruning, masks, commits)
        self._path: list[int] = []  # draft tokens consumed beyond the committed ones

    def prune(self, draft: Draft) -> Draft:
        """``draft`` without the nodes the grammar forbids (and their descendants)."""
        if not len(draft):
            return draft
        began = time.perf_counter()
        paths: list[list[int] | None] = [[]]
        keep: list[int] = []
        for node, (token, parent) in enumerate(
            zip(draft.tokens.tolist(), draft.parents.tolist(), strict=True)
        ):
            base = paths[parent + 1]
            if base is not None:
                self._goto(base)
                if self.matcher.validate_tokens([token]) == 1:
                    keep.append(node)
                    paths.append([*base, token])
                    continue
            paths.append(None)
        self.seconds += time.perf_counter() - began
        return draft if len(keep) == len(draft) else draft.subset(keep)

    def rows(
        self, logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int]
    ) -> MaskedRows:
        """A step's rows ``[k+1, V]`` masked on demand (row ``i + 1`` after node ``i``'s path)."""
        return MaskedRows(self, logits, [int(t) for t in tokens], [int(p) for p in parents])

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance the committed state by the step's emitted tokens (up to an EOS, which
        ends the output)."""
        began = time.perf_counter()
        self._goto([])
        ids = [int(t) for t in tokens]
        end = next((i for i, t in enumerate(ids) if t in self.eos_ids), len(ids))
        if not self.matcher.consume_tokens(ids[:end]):
            raise RuntimeError(f"grammar rejected an emitted token: {self.matcher.get_error()}")
        self.seconds += time.perf_counter() - began

    def forbidden(self, path: Sequence[int]) -> torch.Tensor:
        """Bool ``[V]``: the tokens the grammar forbids after the committed tokens + ``path``."""
        self._goto(list(path))
        if self.matcher.is_error():
            raise RuntimeError(f"grammar failed: {self.matcher.get_error()}")
        # invert the packed bits (8 tokens a byte), then unpack: one pass over the vocabulary
        bits = np.invert(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8))
        return torch.from_numpy(
            np.unpackbits(bits, bitorder="little")[: self.vocab_size].view(bool)
        )

    def _goto(self, path: list[int]) -> None:
        """Move the matcher to the committed tokens followed by ``path`` (a grammar-valid path)."""
        current = self._path
        common = 0
        for a, b in zip(current, path, strict=False):
            if a != b:
                break
            common += 1
        if common < len(current):
            self.matcher.rollback(len(current) - common)
        if common < len(path) and not self.matcher.consume_tokens(path[common:]):
            raise RuntimeError(f"grammar rejected a draft path: {self.matcher.get_error()}")
        self._path = list(path)


class MaskedRows:
    """Row ``r`` of a step's logits with the grammar's mask at that row applied."""

    def __init__(
        self, constraint: Constraint, logits: torch.Tensor, tokens: list[int], parents: list[int]
    ) -> None:
        self.constraint = constraint
        self.logits = logits
        self.paths: list[list[int]] = [[]]
        for token, parent in zip(tokens, parents, strict=True):
            self.paths.append([*self.paths[parent + 1], token])

    def __getitem__(self, row: int) -> torch.Tensor:
        began = time.perf_counter()
        forbidden = self.constraint.forbidden(self.paths[row]).to(self.logits.device)
        masked = self.logits[row].float().masked_fill(forbidden, float("-inf"))
        self.constraint.seconds += time.perf_counter() - began
        return masked
