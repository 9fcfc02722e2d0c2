"""KV cache and forward semantics: incremental = full, truncation, tree masks, compaction."""

from __future__ import annotations

import pytest
import torch

from local_verifier.model import ModelConfig, Transformer
from local_verifier.testing.kv_cache import KVCache, forward

CFG = ModelConfig(
    vocab_size=97,
    dim=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=64,
    max_seq_len=64,
    qkv_bias=True,
)


def _model() -> Transformer:
    return Transformer.from_config(CFG, "cpu", torch.float32)


def test_chunked_forward_equals_full_forward() -> None:
    model = _model()
    tokens = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79])
    cache = KVCache(CFG, 16)
    full = forward(model, tokens, cache)
    assert cache.length == 8
    cache.reset()
    parts = [
        forward(model, tokens[:3], cache),
        forward(model, tokens[3:4], cache),
        forward(model, tokens[4:], cache),
    ]
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=1e-5)
    last = forward(model, tokens, KVCache(CFG, 16), last_only=True)
    torch.testing.assert_close(last, full[-1:], atol=1e-5, rtol=1e-5)


def test_truncate_then_rewrite_matches_fresh_run() -> None:
    model = _model()
    cache = KVCache(CFG, 16)
    forward(model, torch.tensor([1, 2, 3, 4, 5]), cache)
    cache.truncate(3)
    assert cache.length == 3
    again = forward(model, torch.tensor([7, 8]), cache)
    fresh = forward(model, torch.tensor([1, 2, 3, 7, 8]), KVCache(CFG, 16))[3:]
    torch.testing.assert_close(again, fresh, atol=1e-5, rtol=1e-5)


def test_tree_mask_branches_match_separate_chains_and_compact() -> None:
    model = _model()
    prefix = torch.tensor([5, 6, 7])
    # tree: node0 = 10 (child of root), node1 = 11 (child of 0), node2 = 12 (child of root)
    tokens = torch.tensor([10, 11, 12])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    positions = torch.tensor([3, 4, 3])
    cache = KVCache(CFG, 16)
    forward(model, prefix, cache)
    tree = forward(model, tokens, cache, positions=positions, tree_mask=mask)
    chain_a = forward(model, torch.tensor([5, 6, 7, 10, 11]), KVCache(CFG, 16))[3:]
    chain_b = forward(model, torch.tensor([5, 6, 7, 12]), KVCache(CFG, 16))[3:]
    torch.testing.assert_close(tree[:2], chain_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tree[2:], chain_b, atol=1e-5, rtol=1e-5)
    # accept branch b: move slot 5 to slot 3, continue from there
    cache.compact([5], 3)
    cache.truncate(4)
    after = forward(model, torch.tensor([9]), cache)
    expected = forward(model, torch.tensor([5, 6, 7, 12, 9]), KVCache(CFG, 16))[-1:]
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


def test_bf16_forward_runs_and_returns_fp32() -> None:
    model = Transformer.from_config(CFG, "cpu", torch.bfloat16)
    out = forward(model, torch.tensor([1, 2, 3]), KVCache(CFG, 8, dtype=model.kv_dtype))
    assert out.dtype == torch.float32 and out.shape == (3, CFG.vocab_size)
    assert model.rope_cos.dtype == torch.float32


def test_a_kv_cache_of_another_dtype_is_refused() -> None:
    model = Transformer.from_config(CFG, "cpu", torch.float32)
    with pytest.raises(ValueError, match="K/V storage holds torch.bfloat16"):
        forward(model, torch.tensor([1, 2, 3]), KVCache(CFG, 8, dtype=torch.bfloat16))
