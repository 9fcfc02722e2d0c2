"""``Transformer.step`` over a shared ``KVStorage``: slots, logits modes, several sequences."""

from __future__ import annotations

import torch

from local_verifier.config import ModelConfig
from local_verifier.kv_storage import KEY_TILE, KVStorage
from local_verifier.model import SeqStep, Transformer
from local_verifier.testing.kv_cache import KVCache, forward

CFG = ModelConfig(
    vocab_size=97,
    dim=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=64,
    max_seq_len=128,
    qkv_bias=True,
)


def _model() -> Transformer:
    return Transformer.from_config(CFG, "cpu", torch.float32)


def _seq(tokens: list[int], slots: list[int], context: list[int], logits: str = "all") -> SeqStep:
    n = len(context)
    return SeqStep(
        tokens=torch.tensor(tokens),
        positions=torch.arange(n, n + len(tokens)),
        new_slots=torch.tensor(slots),
        context_slots=torch.tensor(context, dtype=torch.long),
        logits=logits,
    )


def test_storage_shape_and_bytes() -> None:
    kv = KVStorage(CFG, 10)  # rounded up to whole key tiles
    assert kv.n_slots == KEY_TILE
    assert kv.k.shape == (CFG.n_layers, 1, CFG.n_kv_heads, CFG.head_dim, KEY_TILE)
    assert kv.v.shape == (CFG.n_layers, KEY_TILE, CFG.n_kv_heads, CFG.head_dim)
    assert kv.nbytes() == KEY_TILE * KVStorage.bytes_per_slot(CFG, torch.float32)
    assert KVStorage.bytes_per_slot(CFG, torch.bfloat16) * 2 == KVStorage.bytes_per_slot(
        CFG, torch.float32
    )


def test_step_matches_batch1_forward_in_scattered_slots() -> None:
    model = _model()
    tokens = [3, 14, 15, 92, 65, 35, 89]
    expected = forward(model, torch.tensor(tokens), KVCache(CFG, 16))
    kv = KVStorage(CFG, 40)
    slots = [31, 2, 17, 8, 0, 39, 5]  # any slots, any order: only the slot lists matter
    first = model.step([_seq(tokens[:4], slots[:4], [])], kv)[0]
    second = model.step([_seq(tokens[4:], slots[4:], slots[:4])], kv)[0]
    torch.testing.assert_close(torch.cat([first, second]), expected, atol=1e-5, rtol=1e-5)
    cache = KVCache(CFG, 16)
    forward(model, torch.tensor(tokens), cache)
    torch.testing.assert_close(
        kv.keys(torch.tensor(slots)), cache.storage.keys(torch.arange(7)), atol=1e-6, rtol=1e-5
    )


def test_logits_modes_and_several_sequences() -> None:
    model = _model()
    kv = KVStorage(CFG, 64)
    a = _seq([1, 2, 3], [0, 1, 2], [], logits="all")
    b = _seq([4, 5, 6, 7], [10, 11, 12, 13], [], logits="last")
    c = _seq([8, 9], [20, 21], [], logits="none")
    out = model.step([a, b, c], kv)
    assert [o.shape for o in out] == [(3, 97), (1, 97), (0, 97)]
    assert all(o.dtype == torch.float32 for o in out)
    alone = model.step([_seq([4, 5, 6, 7], [30, 31, 32, 33], [])], KVStorage(CFG, 64))[0]
    torch.testing.assert_close(out[1], alone[-1:], atol=1e-5, rtol=1e-5)
    assert kv.keys(torch.arange(20, 22)).abs().sum() > 0  # K/V written even without logits


def test_tree_rows_match_their_chains() -> None:
    model = _model()
    kv = KVStorage(CFG, 64)
    model.step([_seq([5, 6, 7], [0, 1, 2], [])], kv)
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    tree = SeqStep(
        tokens=torch.tensor([10, 11, 12]),
        positions=torch.tensor([3, 4, 3]),
        new_slots=torch.tensor([3, 4, 5]),
        context_slots=torch.tensor([0, 1, 2]),
        mask=mask,
    )
    out = model.step([tree], kv)[0]
    chain_a = forward(model, torch.tensor([5, 6, 7, 10, 11]), KVCache(CFG, 8))[3:]
    chain_b = forward(model, torch.tensor([5, 6, 7, 12]), KVCache(CFG, 8))[3:]
    torch.testing.assert_close(out[:2], chain_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[2:], chain_b, atol=1e-5, rtol=1e-5)
