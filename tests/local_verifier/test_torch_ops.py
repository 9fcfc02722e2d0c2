"""The torch step kernels' attention: a row's output is its own, however the rows are gathered."""

import pytest
import torch

from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.torch_ops import TorchOps
from local_verifier.kv_storage import KEY_TILE

HEADS, KV_HEADS, DIM, SLOTS = 6, 2, 16, 256


def _mixed_plan() -> AttentionPlan:
    """A 1-row decode, a 5-row causal chunk and a 4-row draft tree, over scattered slots."""
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    return AttentionPlan.build(
        [torch.arange(100, 140), torch.arange(3, 20), torch.arange(160, 240, 2)],
        [torch.tensor([141]), torch.arange(20, 25), torch.tensor([241, 243, 245, 247])],
        [None, None, tree],
    )


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gather_slots", [1, 60, 1 << 16])
def test_each_row_equals_the_row_alone(kv_dtype: torch.dtype, gather_slots: int) -> None:
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(SLOTS // KEY_TILE, KV_HEADS, DIM, KEY_TILE, generator=gen).to(kv_dtype)
    v_cache = torch.randn(SLOTS, KV_HEADS, DIM, generator=gen).to(kv_dtype)
    plan = _mixed_plan()
    q = torch.randn(10, HEADS, DIM, generator=gen)
    together = TorchOps(gather_slots).attention(q, k_cache, v_cache, plan)
    assert together.shape == q.shape
    for row in range(10):
        keys = plan.row_keys(row)
        alone = AttentionPlan.build([keys[:-1]], [keys[-1:]], [None])
        expected = TorchOps().attention(q[row : row + 1], k_cache, v_cache, alone)[0]
        assert torch.equal(together[row], expected), row
