"""The rope tables: computed a chunk of positions at a time, bit for bit the tables of one
float64 pass over every position."""

from __future__ import annotations

import pytest
import torch

from local_verifier.config import ModelConfig
from local_verifier.rope import ROPE_CHUNK, rope_inv_freq, rope_tables


def _one_pass(cfg: ModelConfig, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq, mscale = rope_inv_freq(cfg)
    freqs = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    cos = (torch.cat([freqs, freqs], dim=-1).cos() * mscale).float()
    sin = (torch.cat([-freqs, freqs], dim=-1).sin() * mscale).float()
    return cos, sin


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}],
)
@pytest.mark.parametrize("positions", [1, ROPE_CHUNK, 3 * ROPE_CHUNK + 5])
def test_chunked_tables_equal_one_pass(scaling: dict[str, object] | None, positions: int) -> None:
    cfg = ModelConfig(
        vocab_size=64, dim=256, n_layers=1, n_heads=4, n_kv_heads=4, head_dim=64,
        hidden_dim=512, rope_theta=500000.0, rope_scaling=scaling, norm_eps=1e-5,
    )  # fmt: skip
    cos, sin = rope_tables(cfg, torch.device("cpu"), positions)
    want_cos, want_sin = _one_pass(cfg, positions)
    assert cos.shape == (positions, 64) and cos.dtype == torch.float32
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    if scaling is not None:
        assert rope_inv_freq(cfg)[1] != 1.0  # yarn's attention factor is in the tables
