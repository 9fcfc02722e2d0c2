"""Batch-1 steps straight on ``Transformer.step``: the plain decoding other paths are
compared with."""

from __future__ import annotations

import torch

from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.model import SeqStep, Transformer


def step_logits(
    model: Transformer, kv: KVStorage, tokens: list[int], start: int, rows: str = "all"
) -> torch.Tensor:
    """Logits of the ``rows`` ("all", "last", "none") of ``tokens`` fed at slots and
    positions [start, start + T) after the slots before ``start``."""
    slots = torch.arange(start, start + len(tokens))
    seq = SeqStep(torch.tensor(tokens), slots, slots, torch.arange(start), logits=rows)
    (logits,) = model.step([seq], kv)
    return logits


def plain_decode(lm: LoadedModel, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding one token per step: the ``n`` tokens and each step's logits."""
    kv = KVStorage(lm.config, len(prompt) + n, dtype=lm.model.kv_dtype)
    rows = [step_logits(lm.model, kv, prompt, 0, "last")]
    tokens = [int(rows[-1].argmax())]
    for i in range(n - 1):
        rows.append(step_logits(lm.model, kv, tokens[-1:], len(prompt) + i))
        tokens.append(int(rows[-1].argmax()))
    return tokens, torch.cat(rows)


def verify_batched(
    lm: LoadedModel, prompt: list[int], tokens: list[int], other: list[int], split: int
) -> torch.Tensor:
    """The prompt in two chunks (at ``split``), then ``tokens[:-1]`` as one verify step (a
    draft chain) batched with the prefill of ``other``: the logits of the prompt's last row
    and of the chain's rows."""
    n = len(prompt)
    base = n + len(tokens)
    kv = KVStorage(lm.config, base + len(other), dtype=lm.model.kv_dtype)
    step_logits(lm.model, kv, prompt[:split], 0, "none")
    first = step_logits(lm.model, kv, prompt[split:], split, "last")
    rows = torch.arange(n, n + len(tokens) - 1)
    other_slots = torch.arange(base, base + len(other))
    verify, _ = lm.model.step(
        [
            SeqStep(torch.tensor(tokens[:-1]), rows, rows, torch.arange(n)),
            SeqStep(torch.tensor(other), torch.arange(len(other)), other_slots, other_slots[:0]),
        ],
        kv,
    )
    return torch.cat([first, verify])
