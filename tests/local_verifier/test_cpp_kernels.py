"""The C++ step kernels called directly, on shapes whose reductions end in a partial vector
(37 is no multiple of 8 or 16; head_dim 12 neither): each row's output is bitwise the same
alone as in a call of many rows, and close to the torch kernels."""

from __future__ import annotations

import pytest
import torch

from local_verifier.kernels.cpp import CppOps, load_library
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.torch_ops import TorchOps

LIBRARY, WHY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason=f"no C++ kernels here: {WHY}")


@pytest.fixture
def cpp() -> CppOps:
    assert LIBRARY is not None
    return CppOps(LIBRARY)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_rows_alone_equal_rows_together(cpp: CppOps, dtype: torch.dtype) -> None:
    x, w = _randn(70, 37, seed=1), _randn(13, 37, seed=2).to(dtype)
    b = _randn(13, seed=3).to(dtype)  # a bf16 bias widens in the wrapper
    together = cpp.linear(x, w, b)
    for i in range(70):
        assert torch.equal(cpp.linear(x[i : i + 1], w, b)[0], together[i]), i
    for n in (2, 3, 5, 17, 64, 65):  # every tile and remainder shape of the row count
        assert torch.equal(cpp.linear(x[:n], w, b), together[:n]), n
    assert torch.equal(together, cpp.linear(x, w.float(), b.float()))  # bf16 widens exactly
    torch.testing.assert_close(together, x @ w.float().T + b.float(), atol=1e-5, rtol=1e-5)


def test_norm_and_swiglu_rows_alone_equal_rows_together(cpp: CppOps) -> None:
    x, w = _randn(9, 37, seed=4), _randn(37, seed=5)
    gate_up = _randn(9, 74, seed=6)
    norm, swiglu = cpp.rms_norm(x, w, 1e-5), cpp.silu_mul(gate_up)
    for i in range(9):
        assert torch.equal(cpp.rms_norm(x[i : i + 1], w, 1e-5)[0], norm[i]), i
        assert torch.equal(cpp.silu_mul(gate_up[i : i + 1])[0], swiglu[i]), i
    torch.testing.assert_close(norm, TorchOps().rms_norm(x, w, 1e-5), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(swiglu, TorchOps().silu_mul(gate_up), atol=1e-5, rtol=1e-5)


def test_attention_rows_alone_equal_rows_together(cpp: CppOps) -> None:
    """A causal chunk of 40 rows after 45 context keys (more than one key block, head_dim
    12 in a partial vector, 3 query heads per kv head), row by row and all at once."""
    heads, kv_heads, dim, ctx, rows = 6, 2, 12, 45, 40
    k_cache, v_cache = _randn(100, kv_heads, dim, seed=7), _randn(100, kv_heads, dim, seed=8)
    q = _randn(rows, heads, dim, seed=9)
    context = torch.randperm(100, generator=torch.Generator().manual_seed(10))[: ctx + rows]
    new = context[ctx:]
    plan = AttentionPlan.build([context[:ctx]], [new], [None])
    together = cpp.attention(q, k_cache, v_cache, plan)
    for i in range(rows):
        alone = AttentionPlan.build([context[: ctx + i]], [new[i : i + 1]], [None])
        assert torch.equal(cpp.attention(q[i : i + 1], k_cache, v_cache, alone)[0], together[i]), i
    expected = TorchOps().attention(q, k_cache, v_cache, plan)
    torch.testing.assert_close(together, expected, atol=1e-5, rtol=1e-5)
