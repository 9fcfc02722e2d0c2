"""Token-history-dependent logit adjustments: penalties and logit_bias.

:class:`PenaltyState` turns a step's raw target logits into the logits the target
distribution is built from, given the tokens so far: plain decoding adjusts the one row
after the committed tokens; a verify step adjusts every row, the history of draft node
``i``'s row being the committed tokens plus the draft tokens on the path from the root to
``i``. Row for row the same elementwise operations run on the same values, so the adjusted
logits are bitwise those of plain decoding. The request's bias, seen-token mask and token
counts are tensors built once and updated as tokens are committed, and a step's rows are
adjusted in bulk (``local_verifier.testing.penalties`` is the row-by-row definition the
tests hold it to).

Order and semantics follow vLLM (the OpenAI formula for the two OpenAI penalties):

1. ``logit_bias``: ``logit[t] += bias[t]`` (0 for the tokens it does not name);
2. ``repetition_penalty`` (vLLM/CTRL), over prompt and output tokens: a seen token's
   positive logit is divided by it, a negative one multiplied;
3. ``frequency_penalty`` and ``presence_penalty`` (OpenAI), over output tokens:
   ``logit[t] -= count[t] * frequency + (count[t] > 0) * presence``.
"""

from __future__ import annotations

import functools
import math
import time
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


class PenaltyState:
    """One request's adjustments as tensors, kept up to date with its committed tokens.

    Built once per request: the ``logit_bias`` ids and values, a mask of the tokens seen in
    the prompt and output (repetition penalty) and the output's token counts (frequency and
    presence). :meth:`rows` adjusts a whole verify step at once; a draft path adds its
    tokens to a row's copy of the mask and counts, never to the committed state.
    """

    def __init__(
        self,
        penalties: Penalties,
        tokens: Sequence[int],
        prompt_len: int,
        vocab: int,
        device: torch.device,
    ) -> None:
        """``tokens``: the prompt (its first ``prompt_len``) and the output so far."""
        self.penalties = penalties
        self.seconds_per_row = 0.0  # the last step's host time per adjusted row
        ids, bias = penalties.bias
        # dense: one add over the row, whether the bias names one token or all of them
        self._bias = torch.zeros(vocab, dtype=torch.float32).index_put_((ids,), bias).to(device)
        self._seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._counts = torch.zeros(vocab, dtype=torch.float32, device=device)
        self._seen[torch.tensor(list(tokens), dtype=torch.long, device=device)] = True
        self.commit(tokens[prompt_len:], seen=False)

    def commit(self, tokens: Sequence[int], *, seen: bool = True) -> None:
        """Add emitted ``tokens`` to the output's history."""
        if not tokens:
            return
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self._counts.device)
        if seen:
            self._seen[ids] = True
        self._counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)

    def rows(
        self, logits: torch.Tensor, draft_tokens: Sequence[int], parents: Sequence[int]
    ) -> torch.Tensor:
        """Float32 rows ``[k+1, V]``: row 0 after the committed tokens, row ``i + 1`` after
        draft node ``i`` and its ancestors. Every operation is elementwise within a row, so
        a row's values do not depend on the others: plain decoding (one row) and a verify
        step give the same bits for the same history."""
        began = time.perf_counter()
        n = len(draft_tokens) + 1
        pen = self.penalties
        out = logits[:n].float().clone()
        if pen.logit_bias:
            out += self._bias
        # (row, token) for every draft token on each row's path
        path_rows: list[int] = []
        path_tokens: list[int] = []
        paths: list[list[int]] = [[]]
        for row, (token, parent) in enumerate(zip(draft_tokens, parents, strict=True), 1):
            path = [*paths[int(parent) + 1], int(token)]
            paths.append(path)
            path_rows += [row] * len(path)
            path_tokens += path
        where = (
            torch.tensor(path_rows, dtype=torch.long, device=out.device),
            torch.tensor(path_tokens, dtype=torch.long, device=out.device),
        )
        if pen.repetition_penalty != 1.0:
            seen = self._seen.expand(n, -1).clone()
            seen[where] = True
            rep = pen.repetition_penalty
            out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
        if pen.frequency_penalty or pen.presence_penalty:
            counts = self._counts.expand(n, -1).clone()
            counts.index_put_(
                where, torch.ones(len(path_tokens), device=out.device), accumulate=True
            )
            out -= counts * pen.frequency_penalty + (counts > 0) * pen.presence_penalty
        self.seconds_per_row = (time.perf_counter() - began) / n
        return out
