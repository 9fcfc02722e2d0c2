"""What one sequence's rows cost in a step, by rows and context tokens attended.

A step's forward costs a fixed part (the weights read), plus per row its products with
the weights, plus per context token attended a part once per sequence (reading its K/V:
the rows of one sequence share each block of keys) and a part per row (its scores and the
weighted sum of the values). A decode row at a context of thousands of tokens thus costs
several short rows; the tenants' shares of a step (``step_shares``) are counted so.

A row's seconds come from the live step costs (``row_seconds``); the context tokens that
cost one row are modelled from the model's shape: a row's weights over the K/V values a
context token holds (read once a sequence), and over its query width (computed once a
row), each scaled by a constant fitted to steps of SmolLM2-135M on a Zen 4 CPU (bf16 K/V):
about 2,000 and 1,600 tokens there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from local_verifier.config import ModelConfig

SEQ_SCALE = 0.17  # context tokens per row, read part, over a row's weights / K/V values
ROW_SCALE = 0.2  # the same, computed part, over a row's weights / query width


@dataclass(frozen=True)
class RowPrice:
    """A sequence's seconds in a step: ``row_s * (rows * (1 + context / row_tokens) +
    context / seq_tokens)``: ``seq_tokens`` (``row_tokens``) context tokens attended cost
    one row once per sequence (once per row)."""

    row_s: float = 1.0
    seq_tokens: float = 2000.0
    row_tokens: float = 1600.0

    @classmethod
    def for_config(cls, cfg: ModelConfig) -> RowPrice:
        """The modelled context costs of a model of ``cfg``'s shape."""
        q = cfg.n_heads * cfg.head_dim
        kv = cfg.n_kv_heads * cfg.head_dim
        layer = cfg.dim * (q + 2 * kv) + q * cfg.dim + 3 * cfg.dim * cfg.hidden_dim
        weights = cfg.n_layers * layer + cfg.dim * cfg.vocab_size  # a row's products
        return cls(
            seq_tokens=SEQ_SCALE * weights / (2 * cfg.n_layers * kv),
            row_tokens=ROW_SCALE * weights / (cfg.n_layers * q),
        )

    def with_row_s(self, row_s: float) -> RowPrice:
        return replace(self, row_s=row_s)

    def seq(self, rows: int, context: int) -> float:
        """Seconds of a sequence of ``rows`` rows attending ``context`` committed tokens."""
        per_row = 1.0 + context / self.row_tokens
        return self.row_s * (rows * per_row + context / self.seq_tokens)

    def row(self, context: int) -> float:
        """Seconds one more row of a sequence at ``context`` adds (a draft row)."""
        return self.row_s * (1.0 + context / self.row_tokens)


def row_seconds(table: list[float], rows: int = 8) -> float:
    """A row's seconds by the step cost table: its mean slope over the first ``rows``."""
    top = min(rows, len(table) - 1)
    if top < 2:
        return table[-1]
    return max((table[top] - table[1]) / (top - 1), 1e-12)
