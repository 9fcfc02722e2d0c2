"""Token-history-dependent logit adjustments: penalties and logit_bias.

One function, :func:`adjust`, turns a row of raw target logits into the logits the target
distribution is built from, given the tokens so far. Plain decoding applies it to the
one row after the committed tokens; a verify step applies it to every row, the history of
draft node ``i``'s row being the committed tokens plus the draft tokens on the path from
the root to ``i`` (:func:`adjust_rows`). Row for row the same elementwise operations run on
the same values, so the adjusted logits are bitwise those of plain decoding.

Order and semantics follow vLLM (the OpenAI formula for the two OpenAI penalties):

1. ``logit_bias``: ``logit[t] += bias[t]``;
2. ``repetition_penalty`` (vLLM/CTRL), over prompt and output tokens: a seen token's
   positive logit is divided by it, a negative one multiplied;
3. ``frequency_penalty`` and ``presence_penalty`` (OpenAI), over output tokens:
   ``logit[t] -= count[t] * frequency + (count[t] > 0) * presence``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

MAX_BIAS = 100.0


@dataclass(frozen=True)
class Penalties:
    """The request's history-dependent adjustments (the defaults change nothing)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        rep = self.repetition_penalty
        if not _finite(rep) or rep <= 0:
            raise ValueError(f"repetition_penalty must be a number > 0, got {rep!r}")
        for token, bias in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids, got {token!r}")
            if not _finite(bias) or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias!r}")

    @property
    def active(self) -> bool:
        """False when :func:`adjust` would return the logits unchanged."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )

    @functools.cached_property
    def bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``logit_bias`` as (token ids, float32 biases), built once per request: a bias
        over the whole vocabulary is applied to every verify row of every step."""
        ids = torch.tensor(list(self.logit_bias), dtype=torch.long)
        return ids, torch.tensor(list(self.logit_bias.values()), dtype=torch.float32)

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ``ValueError`` when a ``logit_bias`` token is outside the vocabulary."""
        bad = [t for t in self.logit_bias if t >= vocab_size]
        if bad:
            raise ValueError(
                f"logit_bias token {bad[0]} is outside the vocabulary [0, {vocab_size})"
            )


def _finite(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def adjust(
    logits: torch.Tensor, penalties: Penalties, prompt: Sequence[int], output: Sequence[int]
) -> torch.Tensor:
    """Float32 logits ``[V]`` after logit_bias and the penalties, given the tokens so far."""
    out = logits.float().clone()
    if penalties.logit_bias:
        ids, bias = penalties.bias
        out[ids.to(out.device)] += bias.to(out.device)
    if penalties.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*prompt, *output}), dtype=torch.long, device=out.device)
        values = out[seen]
        rep = penalties.repetition_penalty
        out[seen] = torch.where(values > 0, values / rep, values * rep)
    if output and (penalties.frequency_penalty or penalties.presence_penalty):
        history = torch.tensor(list(output), dtype=torch.long, device=out.device)
        counts = torch.bincount(history, minlength=out.shape[-1]).float()
        out -= counts * penalties.frequency_penalty + (counts > 0) * penalties.presence_penalty
    return out


def adjust_rows(
    logits: torch.Tensor,
    penalties: Penalties,
    prompt: Sequence[int],
    output: Sequence[int],
    draft_tokens: Sequence[int],
    parents: Sequence[int],
) -> torch.Tensor:
    """Adjust a verify step's rows ``[k+1, V]``: row 0 after the committed ``output`` (whose
    last token is the root), row ``i + 1`` after draft node ``i`` and its ancestors."""
    paths: list[list[int]] = [list(output)]
    for token, parent in zip(draft_tokens, parents, strict=True):
        paths.append([*paths[int(parent) + 1], int(token)])
    return torch.stack([adjust(logits[i], penalties, prompt, p) for i, p in enumerate(paths)])
