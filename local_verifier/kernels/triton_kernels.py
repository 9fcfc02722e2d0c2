"""Fixed-order Triton kernels of one forward step (CUDA; on CPU tensors under Triton's
interpreter, ``TRITON_INTERPRET=1`` set before this module is imported).

Every kernel has one configuration per dtype, chosen here and never tuned at run time, and
each output row is computed by a program (or a 16-row tile of a program) whose reduction
order is fixed by its block sizes alone: the grid grows with the row count, the order of
any row's arithmetic does not. Matrix products accumulate in float32 with IEEE precision
(no TF32) and no split-K, so a row's result is bitwise the same whatever else is in the
step, wherever in its tile it lands and however many rows the tile holds.
"""

from __future__ import annotations

import triton
import triton.language as tl

TILE_ROWS = 16
"""Rows of one matrix-product tile: every row count is cut into tiles of exactly this size."""
BLOCK_N = 64
BLOCK_K = 64
ATTN_KEYS = 32
"""Keys per attention tile: a row's keys are walked from key 0 in tiles of this size."""
NUM_WARPS = 4


@triton.jit
def _dot(a, b, acc, WIDEN: tl.constexpr):
    """acc + a @ b, accumulated in float32: float32 operands with IEEE precision (no TF32),
    bf16 ones as bf16 products. WIDEN: bf16 operands widened to float32 first, exactly
    (Triton's interpreter multiplies no bf16 operands); their products are exact either way."""
    if WIDEN or a.dtype == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b.to(a.dtype), acc, out_dtype=tl.float32)


@triton.jit
def linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    res_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_res,
    stride_out,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    WIDEN: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """out[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) (+ res[m, n]), k in order by BK."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(
            x_ptr + rows[:, None] * stride_x + kk[None, :],
            mask=(rows[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            w_ptr + cols[None, :] * stride_w + kk[:, None],
            mask=(cols[None, :] < N) & (kk[:, None] < K),
            other=0.0,
        )
        acc = _dot(a, b, acc, WIDEN)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    keep = (rows[:, None] < M) & (cols[None, :] < N)
    if HAS_RES:
        acc += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=keep).to(
            tl.float32
        )
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc, mask=keep)


@triton.jit
def linear_silu_mul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    H,
    K,
    stride_x,
    stride_w,
    stride_out,
    WIDEN: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    """out[m, n] = silu(x[m] . w[n]) * (x[m] . w[H + n]): the gate and up projections of a
    fused ``w13`` ([2H, K]) in one pass, each accumulated in k order as ``linear_kernel``."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    gate = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + ks
        a = tl.load(
            x_ptr + rows[:, None] * stride_x + kk[None, :],
            mask=(rows[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        wmask = (cols[None, :] < H) & (kk[:, None] < K)
        wg = tl.load(w_ptr + cols[None, :] * stride_w + kk[:, None], mask=wmask, other=0.0)
        wu = tl.load(w_ptr + (H + cols[None, :]) * stride_w + kk[:, None], mask=wmask, other=0.0)
        gate = _dot(a, wg, gate, WIDEN)
        up = _dot(a, wu, up, WIDEN)
    out = gate / (1.0 + tl.exp(-gate)) * up
    keep = (rows[:, None] < M) & (cols[None, :] < H)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out, mask=keep)


@triton.jit
def rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    N,
    eps,
    stride_x,
    stride_res,
    stride_out,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row: (x + res) stored to ``sum`` when HAS_RES, then
    ``w * (v * rsqrt(mean(v^2) + eps))`` of it, reduced in float32 over one fixed block."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    v = tl.load(x_ptr + row * stride_x + cols, mask=keep, other=0.0).to(tl.float32)
    if HAS_RES:
        v += tl.load(res_ptr + row * stride_res + cols, mask=keep, other=0.0).to(tl.float32)
        v = v.to(sum_ptr.dtype.element_ty).to(tl.float32)  # normed as stored
        tl.store(sum_ptr + row * stride_out + cols, v, mask=keep)
    inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, w * (v * inv), mask=keep)


@triton.jit
def rope_store_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    slots_ptr,
    k_ptr,
    v_ptr,
    q_ptr,
    stride_qkv,
    N_HEADS: tl.constexpr,
    N_KV: tl.constexpr,
    D: tl.constexpr,
    KEY_TILE: tl.constexpr,
    HEADS_P2: tl.constexpr,
):
    """One program per row: rotate its q and k heads (``x * cos + roll(x, D/2) * sin``),
    write q to ``q``, k into K's tiled layout ``[tiles, N_KV, D, KEY_TILE]`` and v into
    ``[slots, N_KV, D]`` at the row's slot (K/V rounded to the cache's dtype); a row whose
    slot is negative (a padding row) writes no K/V."""
    row = tl.program_id(0)
    heads = tl.arange(0, HEADS_P2)
    d = tl.arange(0, D)
    rolled = (d + D // 2) % D
    live = heads[:, None] < N_HEADS + N_KV
    base = qkv_ptr + row * stride_qkv + heads[:, None] * D
    x = tl.load(base + d[None, :], mask=live, other=0.0).to(tl.float32)
    xr = tl.load(base + rolled[None, :], mask=live, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + row * D + d)
    s = tl.load(sin_ptr + row * D + d)
    rot = x * c[None, :] + xr * s[None, :]
    is_q = heads[:, None] < N_HEADS
    tl.store(q_ptr + row * N_HEADS * D + heads[:, None] * D + d[None, :], rot, mask=is_q)
    slot = tl.load(slots_ptr + row)
    tile = slot // KEY_TILE
    offset = slot % KEY_TILE
    kv_head = heads[:, None] - N_HEADS
    stored = (d * 0 + slot)[None, :] >= 0  # as a block: the interpreter masks with no scalar
    is_k = live & (heads[:, None] >= N_HEADS) & stored
    k_at = k_ptr + tile * (N_KV * D * KEY_TILE) + kv_head * (D * KEY_TILE) + d[None, :] * KEY_TILE
    tl.store(k_at + offset, rot.to(k_ptr.dtype.element_ty), mask=is_k)
    v_heads = tl.arange(0, HEADS_P2)
    v_live = (v_heads[:, None] < N_KV) & stored
    v = tl.load(
        qkv_ptr + row * stride_qkv + (N_HEADS + N_KV + v_heads[:, None]) * D + d[None, :],
        mask=v_live,
        other=0.0,
    )
    tl.store(
        v_ptr + slot * (N_KV * D) + v_heads[:, None] * D + d[None, :],
        v.to(v_ptr.dtype.element_ty),
        mask=v_live,
    )


@triton.jit
def attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    keys_ptr,
    key_start_ptr,
    key_len_ptr,
    out_ptr,
    scale,
    N_HEADS: tl.constexpr,
    N_KV: tl.constexpr,
    D: tl.constexpr,
    KEY_TILE: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per (row, kv head): the row's query heads of that group attend to the
    row's own key list ``keys[start : start + len]`` in tiles of BLOCK keys from key 0,
    with an online softmax in float32; nothing read depends on another row."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    group: tl.constexpr = N_HEADS // N_KV
    g = tl.arange(0, GROUP_P2)
    d = tl.arange(0, D)
    live = g < group
    q_heads = kv_head * group + g
    q = tl.load(
        q_ptr + row * N_HEADS * D + q_heads[:, None] * D + d[None, :], mask=live[:, None], other=0.0
    ).to(tl.float32)
    start = tl.load(key_start_ptr + row)
    length = tl.load(key_len_ptr + row)
    best = tl.full((GROUP_P2,), float("-inf"), dtype=tl.float32)
    total = tl.zeros((GROUP_P2,), dtype=tl.float32)
    acc = tl.zeros((GROUP_P2, D), dtype=tl.float32)
    n = tl.arange(0, BLOCK)
    for k0 in range(0, length, BLOCK):
        inside = k0 + n < length
        slots = tl.load(keys_ptr + start + k0 + n, mask=inside, other=0)
        tiles = slots // KEY_TILE
        offsets = slots % KEY_TILE
        k = tl.load(
            k_ptr
            + tiles[:, None] * (N_KV * D * KEY_TILE)
            + kv_head * (D * KEY_TILE)
            + d[None, :] * KEY_TILE
            + offsets[:, None],
            mask=inside[:, None],
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_ptr + slots[:, None] * (N_KV * D) + kv_head * D + d[None, :],
            mask=inside[:, None],
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        scores = tl.where(inside[None, :], scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=1))
        p = tl.exp(scores - new_best[:, None])
        fade = tl.exp(best - new_best)
        total = total * fade + tl.sum(p, axis=1)
        acc = acc * fade[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        best = new_best
    out = tl.where(total[:, None] > 0, acc / total[:, None], 0.0)  # no keys: a padding row
    tl.store(
        out_ptr + row * N_HEADS * D + q_heads[:, None] * D + d[None, :], out, mask=live[:, None]
    )


@triton.jit
def argmax_kernel(logits_ptr, out_ptr, V, stride, BLOCK: tl.constexpr):
    """One program per row: the lowest index of the row's largest logit, scanned in order."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    where = tl.zeros((BLOCK,), dtype=tl.int32)
    for c0 in range(0, V, BLOCK):
        idx = c0 + cols
        x = tl.load(logits_ptr + row * stride + idx, mask=idx < V, other=float("-inf"))
        better = x > best
        best = tl.where(better, x, best)
        where = tl.where(better, idx, where)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, where, V), axis=0)
    tl.store(out_ptr + row, first)
