"""What one sequence's rows cost in a step, by rows and context tokens attended.

A step's forward costs a fixed part (on a CPU mostly reading the weights), plus per row its
products with the weights, plus per context token attended a read of its K/V once per
sequence (the rows of one sequence share each block of keys) and per row its scores and
its share of the weighted sum of the values. A decode row at a context of thousands of
tokens thus costs several short rows; the tenants' shares of a step (``step_shares``) are
counted so.

A row's seconds and the fixed part come from the live step costs (``with_table``); a
context token's read costs the fixed part's seconds per byte of weights, times its K/V
bytes; its computed part costs a row's seconds times its products over a row's (query
width over weights), scaled by ``ROW_SCALE``, fitted to steps of SmolLM2-135M on a Zen 4
CPU (attention's products run slower than the weights').
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from local_verifier.config import ModelConfig

ROW_SCALE = 0.2  # attention's products per second over the weights' products per second


@dataclass(frozen=True)
class RowPrice:
    """A sequence's seconds in a step: ``row_s * rows * (1 + context / row_tokens) +
    fixed_s * read_share * context``, ``read_share``: a context token's K/V bytes over the
    weights' bytes."""

    read_share: float
    row_tokens: float
    row_s: float = 1.0
    fixed_s: float = 0.0

    @classmethod
    def for_model(cls, model: Any, kv_bytes_per_token: int) -> RowPrice:
        """The context costs of ``model`` (its ``config`` and weights) with K/V of
        ``kv_bytes_per_token`` bytes a token."""
        cfg: ModelConfig = model.config
        q = cfg.n_heads * cfg.head_dim
        kv = cfg.n_kv_heads * cfg.head_dim
        layer = cfg.dim * (q + 2 * kv) + q * cfg.dim + 3 * cfg.dim * cfg.hidden_dim
        products = cfg.n_layers * layer + cfg.dim * cfg.vocab_size  # a row's, with the head
        tensors = [*model.parameters(), *model.buffers()] if hasattr(model, "buffers") else []
        weights = sum(t.numel() * t.element_size() for t in tensors) or 4 * products
        return cls(kv_bytes_per_token / weights, ROW_SCALE * products / (cfg.n_layers * q))

    def with_table(self, table: list[float], rows: int = 8) -> RowPrice:
        """This price with a row's seconds and the fixed part from the step cost table
        (``table[r]``: seconds of a step of r rows): the mean slope over its first ``rows``
        rows, and what one row's step costs besides its row."""
        top = min(rows, len(table) - 1)
        row_s = max((table[top] - table[1]) / (top - 1), 1e-12) if top > 1 else table[-1]
        return replace(self, row_s=row_s, fixed_s=max(table[1] - row_s, 0.0))

    def seq(self, rows: int, context: int) -> float:
        """Seconds of a sequence of ``rows`` rows attending ``context`` committed tokens."""
        return self.row(context) * rows + self.fixed_s * self.read_share * context

    def row(self, context: int) -> float:
        """Seconds one more row of a sequence at ``context`` adds (a draft row)."""
        return self.row_s * (1.0 + context / self.row_tokens)

    def chunk_rows(self, start: int, most: int, seconds: float) -> int:
        """The most rows, up to ``most``, of a prompt chunk from position ``start`` that
        cost at most ``seconds`` (each counted at the chunk's end, the most it attends)."""
        low, high = 0, most
        while low < high:
            mid = (low + high + 1) // 2
            if self.seq(mid, start + mid) <= seconds:
                low = mid
            else:
                high = mid - 1
        return low
