"""The penalties' row-by-row definition from token lists, which ``PenaltyState`` must equal."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from local_verifier.logits_processors import Penalties


def adjust(
    logits: torch.Tensor, penalties: Penalties, prompt: Sequence[int], output: Sequence[int]
) -> torch.Tensor:
    """Float32 logits ``[V]`` after logit_bias and the penalties, given the tokens so far."""
    out = logits.float().clone()
    if penalties.logit_bias:
        ids, bias = penalties.bias
        out += torch.zeros(len(out)).index_put_((ids,), bias)
    if penalties.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*prompt, *output}), dtype=torch.long)
        values = out[seen]
        rep = penalties.repetition_penalty
        out[seen] = torch.where(values > 0, values / rep, values * rep)
    if penalties.frequency_penalty or penalties.presence_penalty:
        counts = torch.bincount(torch.tensor(list(output), dtype=torch.long), minlength=len(out))
        out -= (
            counts.float() * penalties.frequency_penalty + (counts > 0) * penalties.presence_penalty
        )
    return out
