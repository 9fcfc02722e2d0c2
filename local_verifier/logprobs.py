"""Log-probabilities of emitted tokens, read from the rows of the step that emitted them.

The reported distribution is the model's raw one: ``log_softmax`` of the target's logits at
that position, before logit_bias, penalties, temperature and top-k/top-p/min-p (what OpenAI
reports and vLLM's default ``raw_logprobs``), so a token's logprob does not depend on the
sampling settings. Each row is computed on its own, from the row's float32 logits, and the
engine's kernels give a verify row the same logits as a one-token decode step at that
position (batch invariance), so the figures with drafts equal those without, bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's logprob and the ``top`` most likely tokens at its position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


def token_logprobs(
    logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int], top: int
) -> list[TokenLogprob]:
    """``tokens[i]`` was emitted from ``logits[rows[i]]`` (raw logits ``[R, V]``)."""
    out: list[TokenLogprob] = []
    for row, token in zip(rows, tokens, strict=True):
        lp = torch.log_softmax(logits[row].float(), dim=-1)
        best: list[tuple[int, float]] = []
        if top > 0:
            values, ids = torch.topk(lp, top)
            best = list(zip(ids.tolist(), values.tolist(), strict=True))
        out.append(TokenLogprob(int(token), float(lp[token]), best))
    return out
