"""Each Triton kernel against the torch kernels (within a tolerance), and bitwise the same
for a row whatever else shares its call.

Tolerances: float32 1e-4 absolute on unit-scale values (the kernels reduce in other orders
than torch's); bfloat16 2^-6 relative, since the interpreter rounds float32 to bfloat16 its
own way (a GPU rounds to nearest even, as torch does).
"""

from __future__ import annotations

import pytest
import torch

from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.torch_ops import TorchOps
from local_verifier.kernels.triton_ops import TritonOps
from local_verifier.kv_storage import KVStorage
from local_verifier.model import ModelConfig

CFG = ModelConfig(
    vocab_size=300, dim=64, n_layers=1, n_heads=6, n_kv_heads=2, head_dim=16, hidden_dim=96,
    max_seq_len=128,
)  # fmt: skip
TOL = {torch.float32: 1e-4, torch.bfloat16: 2.0**-6}


def _rand(*shape: int, seed: int = 0, device: torch.device) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    scale = max(1.0, float(b.abs().max()))
    assert float((a.float() - b.float()).abs().max()) <= TOL[dtype] * scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_torch_and_each_row_is_alone(device: torch.device, dtype: torch.dtype):
    ops = TritonOps()
    x = _rand(37, 96, device=device).to(dtype)
    w, b = _rand(80, 96, seed=1, device=device).to(dtype), _rand(80, seed=2, device=device)
    res = _rand(37, 80, seed=3, device=device).to(dtype)
    y = ops.linear(x, w, b.to(dtype), residual=res)
    _close(y, TorchOps().linear(x, w, b.to(dtype)) + res, dtype)
    for start, rows in [(0, 1), (5, 1), (3, 2), (0, 16), (7, 17), (20, 17)]:
        part = ops.linear(
            x[start : start + rows], w, b.to(dtype), residual=res[start : start + rows]
        )
        assert torch.equal(part, y[start : start + rows]), (start, rows)


def test_linear_silu_mul_matches_torch_and_is_row_invariant(device: torch.device):
    ops, ref = TritonOps(), TorchOps()
    x, w13 = _rand(19, 96, device=device), _rand(2 * 40, 96, seed=1, device=device)
    y = ops.linear_silu_mul(x, w13)
    _close(y, ref.silu_mul(ref.linear(x, w13, None)), torch.float32)
    assert torch.equal(ops.linear_silu_mul(x[4:5], w13), y[4:5])


def test_rms_norm_with_residual(device: torch.device):
    ops = TritonOps()
    x, r, w = (
        _rand(9, 64, device=device),
        _rand(9, 64, seed=1, device=device),
        _rand(64, seed=2, device=device),
    )
    normed, total = ops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(total, x + r)
    _close(normed, TorchOps().rms_norm(x + r, w, 1e-5), torch.float32)
    assert torch.equal(ops.add_rms_norm(x[3:4], r[3:4], w, 1e-5)[0], normed[3:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store_and_attention_match_torch(device: torch.device, dtype: torch.dtype):
    ops, ref = TritonOps(), TorchOps()
    kv_t, kv_r = (
        KVStorage(CFG, 64, device=device, dtype=dtype),
        KVStorage(CFG, 64, device=device, dtype=dtype),
    )
    qkv = _rand(10, 10 * 16, device=device)
    cos, sin = _rand(10, 16, seed=1, device=device), _rand(10, 16, seed=2, device=device)
    slots = torch.arange(5, 15, device=device)
    q = ops.rope_store(qkv, cos, sin, kv_t.k[0], kv_t.v[0], slots, 6, 2)
    q_ref = ref.rope_store(qkv, cos, sin, kv_r.k[0], kv_r.v[0], slots, 6, 2)
    assert torch.equal(q, q_ref)  # float32 rotation, element by element
    _close(kv_t.k, kv_r.k, dtype)
    _close(kv_t.v, kv_r.v, dtype)
    plan = AttentionPlan.build([torch.arange(5)], [slots.cpu()], [None])
    _close(
        ops.attention(q, kv_t.k[0], kv_t.v[0], plan),
        ref.attention(q, kv_t.k[0], kv_t.v[0], plan),
        torch.float32,
    )


def test_a_row_attends_the_same_alone_batched_and_in_a_tree(device: torch.device):
    ops = TritonOps()
    kv = KVStorage(CFG, 64, device=device)
    qkv = _rand(40, 10 * 16, device=device)
    ops.rope_store(qkv, *(_rand(40, 16, seed=s, device=device) for s in (1, 2)), kv.k[0], kv.v[0],
                   torch.arange(40, device=device), 6, 2)  # fmt: skip
    q = _rand(6, 6, 16, seed=3, device=device)
    ctx = torch.arange(20)
    chain = ops.attention(
        q[:3], kv.k[0], kv.v[0], AttentionPlan.build([ctx], [torch.arange(20, 23)], [None])
    )
    batched = ops.attention(
        q[:5], kv.k[0], kv.v[0],
        AttentionPlan.build([ctx, torch.arange(30, 35)], [torch.arange(20, 23), torch.arange(35, 37)], [None, None]),
    )  # fmt: skip
    assert torch.equal(batched[:3], chain)
    # a tree whose row 2 hangs off row 0: its key list is ctx, 20, 22, as in the chain ctx, 20, 22
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    in_tree = ops.attention(
        q[:3], kv.k[0], kv.v[0], AttentionPlan.build([ctx], [torch.arange(20, 23)], [tree])
    )
    q_chain = torch.stack([q[0], q[2]])
    as_chain = ops.attention(
        q_chain, kv.k[0], kv.v[0], AttentionPlan.build([ctx], [torch.tensor([20, 22])], [None])
    )
    assert torch.equal(in_tree[0], chain[0]) and torch.equal(in_tree[1], chain[1])
    assert torch.equal(in_tree[2], as_chain[1])


def test_argmax_takes_the_lowest_index_of_the_largest(device: torch.device):
    logits = _rand(5, 2500, device=device)
    logits[1, 7] = logits[1, 2100] = 50.0
    logits[3, :] = 1.0
    top = TritonOps().argmax(logits)
    assert top.tolist() == [int(i) for i in logits.argmax(-1).tolist()]
    assert top[1] == 7 and top[3] == 0
