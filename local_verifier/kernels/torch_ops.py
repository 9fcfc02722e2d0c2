"""Batch-invariant step kernels from stock torch ops (any device, any dtype).

Row-wise ops run on tiles of exactly ``TILE_ROWS`` rows (the last one padded with zeros):
at a fixed row count a row's result does not depend on its neighbours or its position, so
it is the same whatever the step's row count. Attention runs one row at a time over that
row's own key list, so its shapes depend on nothing but the row (the lists are built and
copied to the device once per step; a layer gathers many rows' keys in one copy, which
moves values and changes none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kv_storage import key_index

TILE_ROWS = 16
GATHER_SLOTS = 1 << 16
"""Key slots the attention gathers in one copy by default (its K and V: 96 MiB at
SmolLM2's shape in float32)."""


def _tiled(fn: Callable[..., torch.Tensor], *xs: torch.Tensor) -> torch.Tensor:
    """``fn`` over row tiles of exactly ``TILE_ROWS`` rows of every x, rows concatenated."""
    n = xs[0].shape[0]
    pad = -n % TILE_ROWS
    if pad:
        xs = tuple(torch.cat([x, x.new_zeros(pad, *x.shape[1:])]) for x in xs)
    tiles = zip(*(x.split(TILE_ROWS) for x in xs), strict=True)
    return torch.cat([fn(*tile) for tile in tiles])[:n]


class TorchOps:
    """Invariant step kernels from stock torch ops."""

    name = "torch"

    def __init__(self, gather_slots: int = GATHER_SLOTS) -> None:
        self.gather_slots = gather_slots

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        w = weight.to(x.dtype)  # bf16 weights of float32 activations widen exactly
        b = None if bias is None else bias.to(x.dtype)
        return _tiled(lambda t: F.linear(t, w, b), x)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        def norm(t: torch.Tensor) -> torch.Tensor:
            tf = t.float()
            tf = tf * torch.rsqrt(tf.pow(2).mean(-1, keepdim=True) + eps)
            return weight * tf.to(t.dtype)

        return _tiled(norm, x)

    def rope_store(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        new_slots: torch.Tensor,
        n_heads: int,
        n_kv_heads: int,
    ) -> torch.Tensor:
        n, dim = qkv.shape[0], cos.shape[-1]
        heads = n_heads + n_kv_heads

        def rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            xf = x[:, : heads * dim].view(-1, heads, dim).float()
            rolled = xf.roll(dim // 2, -1)
            return (xf * c.unsqueeze(1) + rolled * s.unsqueeze(1)).to(x.dtype)

        qk = _tiled(rotate, qkv, cos, sin)
        tile, offset = key_index(new_slots)
        k_cache[tile, :, :, offset] = qk[:, n_heads:].to(k_cache.dtype)  # rounded if bf16
        v_cache[new_slots] = qkv[:, heads * dim :].reshape(n, n_kv_heads, dim).to(v_cache.dtype)
        return qk[:, :n_heads].contiguous()

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        hidden = gate_up.shape[1] // 2
        return _tiled(lambda t: F.silu(t[:, :hidden]) * t[:, hidden:], gate_up)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_mul(gate_up)

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        plan: AttentionPlan,
    ) -> torch.Tensor:
        joined, lengths = plan.row_key_lists(q.device)
        outs: list[torch.Tensor] = []
        for first, last, start, stop in _gather_groups(lengths, self.gather_slots):
            slots = joined[start:stop]  # rows [first, last)'s key lists, gathered at once
            tile, offset = key_index(slots)
            sizes = lengths[first:last]
            keys = k_cache[tile, :, :, offset].to(q.dtype).split(sizes)
            values = v_cache[slots].to(q.dtype).split(sizes)
            for row, k, v in zip(range(first, last), keys, values, strict=True):
                outs.append(
                    F.scaled_dot_product_attention(
                        q[row].unsqueeze(1).unsqueeze(0),
                        k.transpose(0, 1).unsqueeze(0),
                        v.transpose(0, 1).unsqueeze(0),
                        enable_gqa=True,
                    )[0, :, 0]
                )
        return torch.stack(outs) if outs else torch.empty_like(q)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU: ``gelu_tanh(gate) * up`` of ``[gate | up]`` rows, on row tiles."""
    hidden = gate_up.shape[1] // 2
    return _tiled(lambda t: F.gelu(t[:, :hidden], approximate="tanh") * t[:, hidden:], gate_up)


def _gather_groups(lengths: list[int], budget: int) -> list[tuple[int, int, int, int]]:
    """Consecutive rows (first, last) and their keys' span (start, stop) in the joined key
    lists, each group of rows holding at most ``budget`` keys (or one row)."""
    groups: list[tuple[int, int, int, int]] = []
    first = start = stop = 0
    for row, length in enumerate(lengths):
        if row > first and stop + length - start > budget:
            groups.append((first, row, start, stop))
            first, start = row, stop
        stop += length
    if lengths:
        groups.append((first, len(lengths), start, stop))
    return groups
