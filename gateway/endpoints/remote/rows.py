"""Checks on what an engine returns before any of it is committed: every token id inside
the vocabulary, every logprob finite and at most 0, every rank at least 1, the argmax
and its runner-up both present and in order. A failed check is :class:`UnusableAnswer`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gateway.endpoints.remote.failures import UnusableAnswer

Entry = tuple[int, float, int]  # token id, logprob, rank (1: the argmax)


def token_id(value: Any, vocab_size: int) -> int:
    """A token id of the vocabulary (an int, or a decimal string as JSON object keys are)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 12:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise UnusableAnswer(f"a token id outside the vocabulary ({vocab_size})")
    return value


def token_ids(values: Any, vocab_size: int) -> list[int]:
    """A JSON list of token ids (numbers only), each in the vocabulary."""
    if not isinstance(values, list) or any(isinstance(v, str) for v in values):
        raise UnusableAnswer("token ids are not a list of numbers")
    return [token_id(v, vocab_size) for v in values]


def logprob(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnusableAnswer("a logprob is not a number")
    number = float(value)
    if not math.isfinite(number) or number > 0.0:
        raise UnusableAnswer("a logprob is not finite or above 0")
    return number


def rank(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UnusableAnswer("a rank below 1")
    return value


def argmax_and_gap(entries: Sequence[Entry]) -> tuple[int, float]:
    """The rank-1 token and its lead over the rank-2 one; both must be there, ranks
    distinct, and no entry may beat the argmax or sit between the two."""
    by_rank = {r: (t, lp) for t, lp, r in entries}
    if len(by_rank) != len(entries) or 1 not in by_rank or 2 not in by_rank:
        raise UnusableAnswer("a row without a distinct argmax and runner-up")
    (best, top), (_, second) = by_rank[1], by_rank[2]
    if len({t for t, _, _ in entries}) != len(entries):
        raise UnusableAnswer("a row names one token twice")
    if any(lp > top or (r > 2 and lp > second) for _, lp, r in entries) or second > top:
        raise UnusableAnswer("a row's logprobs are out of rank order")
    return best, top - second


def vllm_prompt_row(row: Any, vocab_size: int) -> tuple[int, float]:
    """vLLM's ``prompt_logprobs`` entry ``{"<id>": {"logprob", "rank", ...}}``."""
    if not isinstance(row, dict) or not row:
        raise UnusableAnswer("a prompt_logprobs row is not an object")
    entries = []
    for key, value in row.items():
        if not isinstance(value, dict):
            raise UnusableAnswer("a prompt_logprobs entry is not an object")
        entries.append(
            (token_id(key, vocab_size), logprob(value.get("logprob")), rank(value.get("rank")))
        )
    return argmax_and_gap(entries)


def vllm_output_step(step: Any, vocab_size: int) -> tuple[int, float]:
    """vLLM's token-in ``logprobs.content[0]``: ``top_logprobs`` as ``{token_id, logprob,
    rank}`` objects, the sampled token first."""
    if not isinstance(step, dict) or not isinstance(step.get("top_logprobs"), list):
        raise UnusableAnswer("the output logprobs are not the token-in shape")
    entries = []
    for value in step["top_logprobs"]:
        if not isinstance(value, dict):
            raise UnusableAnswer("an output logprob is not an object")
        entries.append(
            (
                token_id(value.get("token_id"), vocab_size),
                logprob(value.get("logprob")),
                rank(value.get("rank")),
            )
        )
    best, gap = argmax_and_gap(entries)
    if token_id(step.get("token_id"), vocab_size) != best:
        raise UnusableAnswer("the greedy token is not the argmax")
    return best, gap


def sglang_row(row: Any, vocab_size: int) -> tuple[int, float]:
    """SGLang's top-k list ``[[logprob, token_id, text], ...]``, best first."""
    if not isinstance(row, list):
        raise UnusableAnswer("a top-logprobs row is not a list")
    entries = []
    for i, value in enumerate(row):
        if not isinstance(value, list) or len(value) < 2:
            raise UnusableAnswer("a top-logprobs entry is not [logprob, token_id, ...]")
        entries.append((token_id(value[1], vocab_size), logprob(value[0]), i + 1))
    return argmax_and_gap(entries)
