"""Plain decoding, one token per batch-1 step on the sequence's own K/V: the reference the
engine's speculative decoding is checked against."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from local_verifier.errors import PromptTooLong
from local_verifier.kernels.cpp import release_threads
from local_verifier.loader import LoadedModel
from local_verifier.output import OutputAssembler, TextDelta
from local_verifier.sampling import (
    SamplingParams,
    greedy_token,
    make_generator,
    sample,
    target_probs,
)
from local_verifier.testing.kv_cache import forward, new_cache


@dataclass(frozen=True)
class PlainResult:
    """The last item of ``generate_plain``."""

    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    prefill_s: float
    decode_s: float


def check_prompt(prompt_ids: Sequence[int], context_length: int) -> None:
    """Raise ``PromptTooLong`` unless at least one token can be generated after the prompt."""
    if not prompt_ids:
        raise ValueError("the prompt has no tokens")
    if len(prompt_ids) >= context_length:
        raise PromptTooLong(len(prompt_ids), context_length)


def generate_plain(
    lm: LoadedModel,
    prompt_ids: Sequence[int],
    params: SamplingParams,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
) -> Iterator[TextDelta | PlainResult]:
    """Yield a ``TextDelta`` per generated token, then a ``PlainResult``.

    Ends on an EOS id (not emitted), a stop string (its text not emitted), ``max_tokens``
    or the end of the context. Bad input raises before the first item.
    """
    context = lm.context_length
    check_prompt(prompt_ids, context)
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    room = context - len(prompt_ids)
    limit = room if max_tokens is None else min(max_tokens, room)
    return _decode(lm, list(prompt_ids), params, limit, list(stop))


def _decode(
    lm: LoadedModel, prompt: list[int], params: SamplingParams, limit: int, stop: list[str]
) -> Iterator[TextDelta | PlainResult]:
    model = lm.model
    cache = new_cache(lm, len(prompt) + limit)
    generator = make_generator(params.seed, lm.device)
    out = OutputAssembler(lm.tokenizer, stop, limit)

    def pick(logits: torch.Tensor) -> int:
        if params.greedy:
            return greedy_token(logits)
        return sample(target_probs(logits, params), generator)

    start = time.perf_counter()
    try:
        token = pick(forward(model, torch.tensor(prompt), cache, last_only=True)[-1])
        prefill_s = time.perf_counter() - start
        while True:
            delta = out.push([token])
            if delta.token_ids or delta.text:
                yield delta
            if out.finish_reason is not None or cache.length >= cache.max_len:
                break
            token = pick(forward(model, torch.tensor([token]), cache)[-1])
    finally:
        if lm.device.type == "cpu":
            release_threads()  # this thread's team would slow an engine thread's steps
    tail = out.finish()
    if tail.text:
        yield tail
    yield PlainResult(
        token_ids=list(out.token_ids),
        finish_reason=out.finish_reason or "length",
        prompt_tokens=len(prompt),
        prefill_s=prefill_s,
        decode_s=time.perf_counter() - start - prefill_s,
    )
