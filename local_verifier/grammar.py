"""Structured output: a grammar's token mask, part of the target distribution (llguidance).

A request with a grammar samples from the target's logits with every token the grammar
forbids after the tokens so far set to ``-inf`` (before temperature, min-p, top-k and
top-p, after the penalties). Plain decoding masks the one row after the committed tokens;
a verify step masks row ``i + 1`` with the state after the committed tokens plus the draft
path from the root to node ``i``, so row for row the same mask meets the same logits and
the result is bitwise that of plain decoding. Draft nodes the grammar forbids are cut from
the draft before the forward pass (:meth:`Constraint.prune`). One llguidance matcher per
request follows the committed tokens; a step walks draft paths on one copy of it, with its
``rollback``. A request's grammar is compiled once, under :data:`LIMITS`, on the thread
that submits it (:meth:`GrammarCompiler.compile`); each of its answers starts from a copy
of that matcher. A grammar that compiles may still exceed a per-token limit later in an
answer: that answer ends with :class:`GrammarLimitExceeded`, the client's error, after
the tokens plain decoding emits before it, drafts or not (a step's tokens are committed
one at a time; a draft row over a limit ends the step at its node,
:class:`DraftRowOverLimit`). docs/structured-output.md says why llguidance and why these
limits.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from local_verifier.tokenizer import Tokenizer
from lookup.draft import Draft

# between JSON tokens: bounded, so a sampled answer cannot spend its tokens on whitespace
WHITESPACE = r"[\x20\x0A\x0D\x09]{0,16}"

# Bounds on one request's grammar work, for its compile and every mask and token after
# it (docs/structured-output.md gives the measurements behind each value).
LIMITS = LLParserLimits(
    max_items_in_row=2000,  # parser items in one row: ~500 optional properties of an object
    initial_lexer_fuel=200_000,  # lexer regexes built at compile: ~4 ms of lexer work
    step_lexer_fuel=50_000,  # lexer work for one mask: ~4 ms
    step_max_items=50_000,  # parser items for one mask: ~2.5 ms
    max_lexer_states=20_000,  # lexer states: at most ~40 MB a request
    max_grammar_size=10_000,  # grammar symbols: ~2,500 required or ~1,250 optional properties
    precompute_large_lexemes=True,  # large lexemes walk the token trie at compile, not per mask
    verbose_errors=False,  # error messages name the problem, not the parser's state
)

_NON_VERBOSE = "\n<non-verbose/>"  # llguidance's mark on a parser error that omits its state

# llguidance's errors for one token's work over LIMITS (max_items_in_row, step_max_items,
# step_lexer_fuel, max_lexer_states); its other errors, a rejected token among them, are
# the engine's own failures
_OVER_LIMITS = re.compile(
    r"(?i:parser error): (?:Current row has \d+ items; max is \d+|Too many items \(limit \d+)"
    r"|lexer error: too many (?:expressions constructed|states: \d+ >= \d+)"
)


class InvalidGrammar(ValueError):
    """A grammar or JSON schema llguidance rejects, or whose compile exceeds :data:`LIMITS`."""


class GrammarLimitExceeded(InvalidGrammar):
    """A compiled grammar's work for one token of an answer exceeded :data:`LIMITS`: the
    answer ends. The message is the client's (it names no internals); ``reason`` is
    llguidance's, for the log."""

    def __init__(self, tokens: int, reason: str) -> None:
        super().__init__(
            "response_format's grammar exceeded the engine's per-token grammar limits after "
            f"{tokens} output token{'' if tokens == 1 else 's'}; simplify the schema (for "
            "example fewer optional properties in one object, fewer alternatives or enum "
            "values, simpler string patterns)"
        )
        self.tokens = tokens
        self.reason = reason


@dataclass(frozen=True)
class JsonSchema:
    """Structured output as JSON matching ``schema`` (None: any JSON object); turned into
    llguidance's grammar when the request is compiled."""

    schema: Mapping[str, Any] | None = None


def json_grammar(schema: Mapping[str, Any] | None) -> str:
    """llguidance's grammar text for JSON matching ``schema`` (None: any JSON object).

    Only wraps the schema: the schema is checked when the grammar is compiled.
    """
    spec = {"type": "object"} if schema is None else dict(schema)
    try:
        return LLMatcher.grammar_from_json_schema(
            spec, overrides={"whitespace_pattern": WHITESPACE}
        )
    except (ValueError, TypeError) as exc:
        raise InvalidGrammar(f"invalid JSON schema: {exc}") from None


def lark_json(schema: Mapping[str, Any]) -> str:
    """A Lark ``%json`` item for JSON matching ``schema``, whitespace between its tokens
    bounded as in :func:`json_grammar` (part of a grammar for :func:`lark_grammar`)."""
    guidance = schema.get("x-guidance")
    options = {
        **(guidance if isinstance(guidance, Mapping) else {}),
        "whitespace_pattern": WHITESPACE,
    }
    return "%json " + json.dumps({**schema, "x-guidance": options})


def lark_grammar(lark: str) -> str:
    """llguidance's grammar text for a Lark grammar (llguidance's dialect: ``%json``
    items, ``&`` and ``~`` in lexemes). Checked when it is compiled."""
    return LLMatcher.grammar_from_lark(lark)


def schema_error(schema: Mapping[str, Any]) -> str | None:
    """Why llguidance refuses ``schema`` as a JSON schema under :data:`LIMITS` (None: it
    compiles). The schema alone, without a tokenizer: for naming the part of a larger
    grammar that failed."""
    try:
        reason = LLMatcher.validate_grammar(json_grammar(schema), limits=LIMITS)
    except InvalidGrammar as exc:
        return str(exc).removeprefix("invalid JSON schema: ")
    return reason.removesuffix(_NON_VERBOSE) or None


class GrammarCompiler:
    """Compiles requests' grammars for one tokenizer; its token index is built on first use.

    Thread-safe: requests are compiled on the threads that submit them.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll: LLTokenizer | None = None
        self._lock = threading.Lock()

    def compile(self, grammar: str | JsonSchema) -> CompiledGrammar:
        """``grammar`` (llguidance's format, or a JSON schema) compiled under :data:`LIMITS`.

        Raises :class:`InvalidGrammar` naming the problem when llguidance rejects it or
        its compile or first mask exceeds the limits. llguidance releases the GIL while
        it compiles.
        """
        if isinstance(grammar, JsonSchema):
            text, what = json_grammar(grammar.schema), "invalid JSON schema"
        else:
            text, what = grammar, "invalid grammar"
        matcher = LLMatcher(self._tokenizer(), text, log_level=0, limits=LIMITS)
        if not matcher.is_error():
            matcher.compute_bitmask()  # a first mask over the limits is this error, not a step's
        if matcher.is_error():
            reason = matcher.get_error().removesuffix(_NON_VERBOSE)
            raise InvalidGrammar(f"{what}: {reason}")
        return CompiledGrammar(matcher, self.vocab_size, self.tokenizer.eos_ids)

    def _tokenizer(self) -> LLTokenizer:
        with self._lock:  # two submitting threads build it once
            if self._ll is None:
                eos = sorted(self.tokenizer.eos_ids)
                if not eos:  # the grammar ends the answer with one
                    raise InvalidGrammar(
                        "structured output needs a tokenizer with an end-of-sequence id"
                    )
                self._ll = LLTokenizer(
                    self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=eos
                )
            return self._ll


class CompiledGrammar:
    """A request's compiled grammar: each answer's :class:`Constraint` starts from a copy."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, eos_ids: Set[int]) -> None:
        self._matcher = matcher  # never advanced: the state before any token
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids

    def constraint(self) -> Constraint:
        """A fresh matcher for one answer (a copy of the compiled one: no compile)."""
        return Constraint(self._matcher.deep_copy(), self.vocab_size, self.eos_ids)


class DraftRowOverLimit(Exception):
    """Row ``row`` (> 0) of a verify step cannot be masked: the grammar exceeded a limit on
    the draft path to it. Verification reads a row only once its node was accepted, so that
    path is plain decoding's too: the step ends with that node's token, and
    :meth:`Constraint.commit` fails where plain decoding fails on that path."""

    def __init__(self, row: int) -> None:
        super().__init__(f"draft row {row} over the grammar's limits")
        self.row = row


@dataclass(frozen=True)
class _Overflow:
    """Where a draft path went over a limit: after ``path`` (from the committed state),
    consuming ``token``, or with ``token`` None, masking."""

    path: list[int]
    token: int | None
    reason: str


class Constraint:
    """One request's grammar state: its committed tokens and, within a step, a draft path.

    ``matcher`` follows the committed tokens; draft paths are walked on a copy of it (made
    once per step, when a draft needs one), so a parser limit hit on a draft path leaves the
    committed state usable. llguidance's copies share one lexer, whose fuel a lexer limit
    exhausts for all of them, so a limit hit on a draft path is also remembered
    (``_overflow``): committing that path fails there without the matcher's help.
    """

    def __init__(self, matcher: LLMatcher, vocab_size: int, eos_ids: Set[int]) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.seconds = 0.0  # time spent in the grammar (pruning, masks, commits)
        self.committed = 0  # the answer's tokens the matcher has consumed (up to an EOS)
        self._walker: LLMatcher | None = None  # the committed state + ``_path``
        self._path: list[int] = []  # draft tokens the walker consumed beyond the committed ones
        self._overflow: _Overflow | None = None  # this step's, on a draft path a row needed

    def prune(self, draft: Draft) -> Draft:
        """``draft`` without the nodes the grammar forbids or cannot reach within its
        limits (and their descendants)."""
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
                try:
                    if self._validate(base, token):
                        keep.append(node)
                        paths.append([*base, token])
                        continue
                except GrammarLimitExceeded:  # the parent's path: its other children too
                    paths[parent + 1] = None
            paths.append(None)
        self.seconds += time.perf_counter() - began
        return draft if len(keep) == len(draft) else draft.subset(keep)

    def rows(
        self, logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int]
    ) -> MaskedRows:
        """A step's rows ``[k+1, V]`` masked on demand (row ``i + 1`` after node ``i``'s path)."""
        return MaskedRows(self, logits, [int(t) for t in tokens], [int(p) for p in parents])

    def commit(self, tokens: Sequence[int]) -> GrammarLimitExceeded | None:
        """Advance the committed state by the step's emitted tokens up to an EOS (which ends
        the output), in order, as plain decoding commits them one a step.

        Returns None when all were taken, else the answer's error where plain decoding
        meets it: consuming a token, or masking after the last (a draft row over a limit).
        The tokens before it are committed (``committed`` and the error count them); the
        answer ends there. A token the grammar rejects raises ``RuntimeError`` (never
        sampled from a masked row: the engine's failure).
        """
        began = time.perf_counter()
        overflow, self._overflow = self._overflow, None
        self._drop_walker()  # a draft path starts from the new state
        ids = [int(t) for t in tokens]
        end = next((i for i, t in enumerate(ids) if t in self.eos_ids), len(ids))
        try:
            if overflow is not None and _meets(overflow, ids[:end]):
                self.committed += len(overflow.path)  # the walker consumed them
                return GrammarLimitExceeded(self.committed, overflow.reason)
            for token in ids[:end]:  # llguidance counts none of a list it fails in
                if not self.matcher.consume_token(token):
                    error = self._failed(self.matcher, "grammar rejected an emitted token")
                    if isinstance(error, GrammarLimitExceeded):
                        return error
                    raise error
                self.committed += 1
            return None
        finally:
            self.seconds += time.perf_counter() - began

    def forbidden(self, path: Sequence[int]) -> torch.Tensor:
        """Bool ``[V]``: the tokens the grammar forbids after the committed tokens + ``path``
        (a grammar-valid path). Over a limit: :class:`GrammarLimitExceeded` (on a draft
        path, remembered for :meth:`commit`)."""
        ids = list(path)
        matcher = self._walk(ids, record=True) if ids else self.matcher
        packed = matcher.compute_bitmask()
        if matcher.is_error():  # a failed mask allows only EOS: never used
            error = self._failed(matcher, "grammar failed")
            if ids:
                self._drop_walker()
                if isinstance(error, GrammarLimitExceeded):
                    self._overflow = _Overflow(ids, None, error.reason)
            raise error
        # invert the packed bits (8 tokens a byte), then unpack: one pass over the vocabulary
        bits = np.invert(np.frombuffer(packed, dtype=np.uint8))
        return torch.from_numpy(
            np.unpackbits(bits, bitorder="little")[: self.vocab_size].view(bool)
        )

    def _validate(self, path: list[int], token: int) -> bool:
        """Whether the grammar allows ``token`` after the committed tokens + ``path``."""
        walker = self._walk(path)
        valid = walker.validate_tokens([token]) == 1
        if walker.is_error():
            self._drop_walker()
            raise self._failed(walker, "grammar failed validating a draft token")
        return valid

    def _walk(self, path: list[int], record: bool = False) -> LLMatcher:
        """The walker moved to the committed tokens followed by ``path`` (a grammar-valid
        path); a copy of the committed matcher when the step has none yet. Over a limit:
        :class:`GrammarLimitExceeded`, the walker dropped and, with ``record``, where."""
        if self._walker is None:
            self._walker, self._path = self.matcher.deep_copy(), []
        walker = self._walker
        current = self._path
        common = 0
        for a, b in zip(current, path, strict=False):
            if a != b:
                break
            common += 1
        if common < len(current):
            walker.rollback(len(current) - common)
        # a row's path one token at a time: where a limit is hit is plain decoding's failure
        # (llguidance counts none of a list it fails in, and a copy made after a lexer limit
        # shares the exhausted lexer, so the walker that hit it must tell)
        steps = [path[common:]] if not record else [[t] for t in path[common:]]
        for i, tokens in enumerate(steps):
            if not walker.consume_tokens(tokens):
                self._drop_walker()
                error = self._failed(walker, "grammar rejected a draft path")
                if record and isinstance(error, GrammarLimitExceeded):
                    self._overflow = _Overflow(path[: common + i], tokens[0], error.reason)
                raise error
        self._path = list(path)
        return walker

    def _drop_walker(self) -> None:
        """The next draft path is walked on a fresh copy of the committed matcher."""
        self._walker, self._path = None, []

    def _failed(self, matcher: LLMatcher, what: str) -> Exception:
        """``matcher``'s error (it stays in it): :class:`GrammarLimitExceeded` when a limit
        caused it, else a ``RuntimeError`` saying ``what`` failed and why."""
        reason = matcher.get_error().removesuffix(_NON_VERBOSE)
        if _OVER_LIMITS.match(reason):
            return GrammarLimitExceeded(self.committed, reason)
        return RuntimeError(f"{what}: {reason}")


def _meets(overflow: _Overflow, ids: list[int]) -> bool:
    """Whether committing ``ids`` (no EOS) meets ``overflow``: its path, then its token or
    (a mask) nothing."""
    n = len(overflow.path)
    if ids[:n] != overflow.path:
        return False
    if overflow.token is None:
        return len(ids) == n
    return len(ids) > n and ids[n] == overflow.token


class MaskedRows:
    """Row ``r`` of a step's logits with the grammar's mask at that row applied; a draft row
    over the grammar's limits raises :class:`DraftRowOverLimit`."""

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
        try:
            forbidden = self.constraint.forbidden(self.paths[row]).to(self.logits.device)
        except GrammarLimitExceeded:
            self.constraint.seconds += time.perf_counter() - began
            if not row:  # the committed state's own mask: plain decoding's failure
                raise
            raise DraftRowOverLimit(row) from None
        masked = self.logits[row].float().masked_fill(forbidden, float("-inf"))
        self.constraint.seconds += time.perf_counter() - began
        return masked
