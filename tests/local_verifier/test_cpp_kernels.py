"""The C++ step kernels called directly, on shapes whose reductions end in a partial vector
(37 is no multiple of 8 or 16; head_dim 12 neither): each row's output is bitwise the same
alone as in a call of many rows, and close to the torch kernels; a packed weight gives
bitwise the row-major one's outputs; the bf16 kernels on ``amx``-packed weights (AMX tiles
or AVX512-BF16 dot products, where the CPU has them) give each row the same bits for every
row count and thread count."""

from __future__ import annotations

import pytest
import torch

from local_verifier.devices import cpu_flags
from local_verifier.kernels.cpp import CppOps, load_library, release_threads
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import AMX_K, PACK, layout_of, pack, unpack
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.torch_ops import TorchOps
from local_verifier.kv_storage import KEY_TILE, key_tiles

LIBRARY, WHY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason=f"no C++ kernels here: {WHY}")
AMX = LIBRARY is not None and LIBRARY.dg_bf16_kernels() != 0


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
    k_cache, v_cache = _kv(100, kv_heads, dim, seed=7)
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


def _kv(slots: int, kv_heads: int, dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K (in its stored tiles) and V of ``slots`` slots, rounded up to whole tiles."""
    slots = -(-slots // KEY_TILE) * KEY_TILE
    k, v = _randn(slots, kv_heads, dim, seed=seed), _randn(slots, kv_heads, dim, seed=seed + 1)
    return key_tiles(k), v


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim"),
    # SmolLM2's geometry; partial head_dim; 1 head per kv head; 20 per kv head (no group limit)
    [(9, 3, 64), (5, 1, 20), (4, 4, 12), (40, 2, 12)],
)
def test_long_causal_prompt_in_any_chunks_equals_rows_alone(
    cpp: CppOps, heads: int, kv_heads: int, dim: int
) -> None:
    """A 110-row prompt after 70 context keys (tiles of rows and blocks of keys cross at
    every offset): all at once, in chunks of 1, 7 and 64, and row by row alone agree
    bitwise, and with the torch kernels closely."""
    ctx, rows = 70, 110
    k_cache, v_cache = _kv(300, kv_heads, dim, seed=11)
    q = _randn(rows, heads, dim, seed=13)
    keys = torch.randperm(300, generator=torch.Generator().manual_seed(14))[: ctx + rows]
    plan = AttentionPlan.build([keys[:ctx]], [keys[ctx:]], [None])
    together = cpp.attention(q, k_cache, v_cache, plan)
    for chunk in (1, 7, 64):
        for start in range(0, rows, chunk):
            stop = min(start + chunk, rows)
            part = AttentionPlan.build(
                [keys[: ctx + start]], [keys[ctx + start : ctx + stop]], [None]
            )
            out = cpp.attention(q[start:stop], k_cache, v_cache, part)
            assert torch.equal(out, together[start:stop]), (chunk, start)
    expected = TorchOps().attention(q, k_cache, v_cache, plan)
    torch.testing.assert_close(together, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ctx", [45, 70, 96])
def test_tree_rows_under_a_mask_equal_their_paths_alone(cpp: CppOps, ctx: int) -> None:
    """A 40-row draft tree after ctx context keys (a whole number of blocks, or not): each
    row equals a causal row over the context and its ancestors, alone and batched with a
    decode row and a prompt chunk of other sequences."""
    heads, kv_heads, dim, rows = 9, 3, 64, 40
    k_cache, v_cache = _kv(400, kv_heads, dim, seed=21)
    gen = torch.Generator().manual_seed(22)
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    for i in range(rows):
        mask[i, i] = True
        if i and torch.rand(1, generator=gen) > 0.2:
            mask[i] |= mask[int(torch.randint(0, i, (1,), generator=gen))]
    q = _randn(rows + 1 + 20, heads, dim, seed=23)
    context, new = torch.arange(ctx), torch.arange(200, 200 + rows)
    plan = AttentionPlan.build(
        [torch.arange(300, 330), context, torch.arange(340, 350)],
        [torch.tensor([330]), new, torch.arange(350, 370)],
        [None, mask, None],
    )
    tree = AttentionPlan.build([context], [new], [mask])
    alone = cpp.attention(q[1 : rows + 1], k_cache, v_cache, tree)
    assert torch.equal(cpp.attention(q, k_cache, v_cache, plan)[1 : rows + 1], alone)
    for i in range(rows):
        path = new[mask[i]]
        chain = AttentionPlan.build([torch.cat([context, path[:-1]])], [path[-1:]], [None])
        assert torch.equal(cpp.attention(q[1 + i : 2 + i], k_cache, v_cache, chain)[0], alone[i]), i
    expected = TorchOps().attention(q[1 : rows + 1], k_cache, v_cache, tree)
    torch.testing.assert_close(alone, expected, atol=1e-5, rtol=1e-5)


def _tree_mask(rows: int, gen: torch.Generator) -> torch.Tensor:
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    for i in range(rows):
        mask[i, i] = True
        if i:
            mask[i] |= mask[int(torch.randint(0, i, (1,), generator=gen))]
    return mask


def _serving_step(seed: int, slots: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list]:
    """1-6 sequences of 1-16 rows (chains or draft trees) after 0-300 context keys, each in
    16-slot pool blocks drawn at random from ``slots``: context slots, new slots, masks."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randperm(slots // 16, generator=gen).tolist()
    contexts, news, masks = [], [], []
    for _ in range(int(torch.randint(1, 7, (1,), generator=gen))):
        ctx, rows = (
            int(torch.randint(0, 301, (1,), generator=gen)),
            int(torch.randint(1, 17, (1,), generator=gen)),
        )
        mine = [blocks.pop() for _ in range(-(-(ctx + rows) // 16))]
        keys = torch.tensor([b * 16 + o for b in mine for o in range(16)])
        contexts.append(keys[:ctx])
        news.append(keys[ctx : ctx + rows])
        masks.append(_tree_mask(rows, gen) if torch.rand(1, generator=gen) < 0.5 else None)
    return contexts, news, masks


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(6))
def test_serving_steps_equal_each_sequence_alone_on_any_thread_count(
    cpp: CppOps, seed: int, kv_dtype: torch.dtype
) -> None:
    """Serving-like steps (sequences of chains and trees over scattered pool blocks, blocks
    cut at every offset): every sequence's rows are bitwise the same alone and in the step,
    on 1 and 2 threads, with K/V in float32 and in bf16 (on bf16 dot products where the CPU
    has them)."""
    heads, kv_heads, dim, slots = 9, 3, 64, 2048
    k_cache, v_cache = (kv.to(kv_dtype) for kv in _kv(slots, kv_heads, dim, seed=40 + seed))
    contexts, news, masks = _serving_step(seed, slots)
    rows = [len(n) for n in news]
    q = _randn(sum(rows), heads, dim, seed=50 + seed)
    plan = AttentionPlan.build(contexts, news, masks)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = cpp.attention(q, k_cache, v_cache, plan)
        torch.set_num_threads(1)
        assert torch.equal(cpp.attention(q, k_cache, v_cache, plan), together)
        starts = [0, *torch.tensor(rows).cumsum(0).tolist()]
        for s, (ctx, new, mask) in enumerate(zip(contexts, news, masks, strict=True)):
            alone = AttentionPlan.build([ctx], [new], [mask])
            out = cpp.attention(q[starts[s] : starts[s + 1]], k_cache, v_cache, alone)
            assert torch.equal(out, together[starts[s] : starts[s + 1]]), s
    finally:
        torch.set_num_threads(before)
    dotted = AMX and kv_dtype == torch.bfloat16  # scores from q rounded to bf16
    expected = TorchOps().attention(
        q.bfloat16().float() if dotted else q, k_cache.float(), v_cache.float(), plan
    )
    torch.testing.assert_close(together, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (6, 2, 12)])
def test_bf16_kv_is_stored_rounded_and_read_widened_exactly(
    cpp: CppOps, heads: int, kv_heads: int, dim: int
) -> None:
    """K/V in bf16: rope_store writes each value rounded as torch rounds it (ties to even,
    overflow to inf, a NaN stays NaN). Attention over them, on a serving-like step (head_dim
    12: a partial vector), is bitwise attention over the same values widened to float32;
    where the CPU has the bf16 kernels, its scores are bf16 dot products of the query rounded
    to bf16 instead: close to float32 attention of that query, and never bitwise the float32
    kernel's (whose query is not rounded)."""
    rows, slots = 20, 2048
    qkv = _randn(rows, (heads + 2 * kv_heads) * dim, seed=60)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.4e38, 1e-40, 1.00390625])
    qkv[0, -len(special) :] = special  # into row 0's v
    angles = _randn(rows, dim // 2, seed=61)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    new_slots = torch.randperm(slots, generator=torch.Generator().manual_seed(62))[:rows]
    caches = {t: (torch.zeros(slots // KEY_TILE, kv_heads, dim, KEY_TILE, dtype=t),
                  torch.zeros(slots, kv_heads, dim, dtype=t))
              for t in (torch.float32, torch.bfloat16)}  # fmt: skip
    q = {
        t: cpp.rope_store(qkv, cos, sin, *kv, new_slots, heads, kv_heads)
        for t, kv in caches.items()
    }
    assert torch.equal(q[torch.float32], q[torch.bfloat16])
    for wide, narrow, nans in zip(
        caches[torch.float32], caches[torch.bfloat16], (0, 1), strict=True
    ):
        rounded, nan = wide.to(torch.bfloat16), wide.isnan()  # a NaN's bits: torch's vary
        assert torch.equal(rounded.view(torch.int16)[~nan], narrow.view(torch.int16)[~nan])
        assert torch.equal(narrow.isnan(), nan) and int(nan.sum()) == nans
    k_cache, v_cache = (kv.to(torch.bfloat16) for kv in _kv(slots, kv_heads, dim, seed=63))
    contexts, news, masks = _serving_step(64, slots)
    q_rows = _randn(sum(len(n) for n in news), heads, dim, seed=65)
    plan = AttentionPlan.build(contexts, news, masks)
    narrow_out = cpp.attention(q_rows, k_cache, v_cache, plan)
    wide_out = cpp.attention(q_rows, k_cache.float(), v_cache.float(), plan)
    if AMX:
        rounded_q = cpp.attention(q_rows.bfloat16().float(), k_cache.float(), v_cache.float(), plan)
        torch.testing.assert_close(narrow_out, rounded_q, atol=1e-5, rtol=1e-5)
        assert not torch.equal(narrow_out, wide_out)
    else:
        assert torch.equal(narrow_out, wide_out)
    with pytest.raises(TypeError, match="K/V"):
        cpp.attention(q_rows, k_cache, v_cache.float(), plan)


def test_a_released_team_is_built_again_for_the_next_call(cpp: CppOps) -> None:
    """release_threads frees this thread's OpenMP team between calls (twice over, too): the
    next parallel call builds one and gives the same bits."""
    x, w = _randn(64, 37, seed=70), _randn(29, 37, seed=71)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = cpp.linear(x, w, None)
        release_threads()
        release_threads()
        assert torch.equal(cpp.linear(x, w, None), first)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf")])
def test_keys_of_other_slots_and_earlier_calls_never_reach_a_row(
    cpp: CppOps, poison: float
) -> None:
    """Keys a row does not allow share its loads: a stored tile's lanes past the row's keys
    hold other slots' keys, and a thread's scratch keeps the keys it last gathered (a
    block of fewer keys leaves part of it as it was). Poisoned there, neither changes a bit
    of a row of 4 keys (one thread: the same scratch)."""
    heads, kv_heads, dim = 9, 3, 64
    keys, v_cache = _randn(128, kv_heads, dim, seed=60), _randn(128, kv_heads, dim, seed=61)
    clean_k = key_tiles(keys)
    keys[1:65] = poison  # read by `long` only, gathered: its first slot starts no tile
    keys[100:112] = poison  # the tile of `stored`'s keys 96..99, past them
    k_cache = key_tiles(keys)
    q = _randn(1, heads, dim, seed=62)
    stored = AttentionPlan.build([torch.arange(96, 99)], [torch.tensor([99])], [None])
    gathered = AttentionPlan.build([torch.arange(113, 116)], [torch.tensor([116])], [None])
    long = AttentionPlan.build([torch.arange(1, 64)], [torch.tensor([64])], [None])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(
            cpp.attention(q, k_cache, v_cache, stored), cpp.attention(q, clean_k, v_cache, stored)
        )
        clean = cpp.attention(q, k_cache, v_cache, gathered)
        assert not cpp.attention(q, k_cache, v_cache, long).isfinite().all()
        assert torch.equal(cpp.attention(q, k_cache, v_cache, gathered), clean)
    finally:
        torch.set_num_threads(before)
    assert clean.isfinite().all()


def test_keys_read_from_their_tiles_equal_the_same_keys_gathered(cpp: CppOps) -> None:
    """The same 70 keys and values in whole tiles in order (read as stored) and scattered
    over the pool (gathered per block) give bitwise the same rows: a causal chunk of 6 rows
    and a decode row."""
    heads, kv_heads, dim, n = 9, 3, 64, 70
    keys, values = _randn(n, kv_heads, dim, seed=63), _randn(n, kv_heads, dim, seed=64)
    scattered = 80 + torch.randperm(176, generator=torch.Generator().manual_seed(65))[:n]
    k_rows, v_cache = torch.zeros(256, kv_heads, dim), torch.zeros(256, kv_heads, dim)
    k_rows[:n], v_cache[:n] = keys, values
    k_rows[scattered], v_cache[scattered] = keys, values
    k_cache = key_tiles(k_rows)
    q = _randn(7, heads, dim, seed=66)
    outs = []
    for slots in (torch.arange(n), scattered):
        plan = AttentionPlan.build(
            [slots[:58], slots[:69]], [slots[58:64], slots[69:]], [None, None]
        )
        outs.append(cpp.attention(q, k_cache, v_cache, plan))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_is_bitwise_the_row_major_one(
    cpp: CppOps, dtype: torch.dtype, threads: int
) -> None:
    """Both layouts, every tile and remainder shape of the row count (1..70: two row blocks)."""
    x, w = _randn(70, 48, seed=11), _randn(80, 48, seed=12).to(dtype)
    b = _randn(80, seed=13)
    packed = pack(w)
    assert packed.shape == (5, 3, PACK, PACK) and torch.equal(unpack(packed), w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for n in (1, 2, 3, 4, 5, 16, 17, 64, 65, 70):
            assert torch.equal(cpp.linear(x[:n], packed, b), cpp.linear(x[:n], w, b)), n
            assert torch.equal(cpp.linear(x[:n], packed, None), cpp.linear(x[:n], w, None)), n
    finally:
        torch.set_num_threads(before)


def test_the_bf16_kernels_run_exactly_where_the_cpu_has_them(cpp: CppOps) -> None:
    """GCC 12+ with -march=native builds them wherever the CPU has AMX-BF16 (AMX tiles, the
    tile state granted by Linux) or AVX512-BF16 (dot products) and AVX-512."""
    flags = cpu_flags()
    assert ({"amx_tile", "amx_bf16"} <= flags) == (cpp.bf16_kernels == "amx")
    assert ("avx512_bf16" in flags and "avx512f" in flags) == AMX
    assert cpp.weight_layout(KernelOptions()) == ("amx" if AMX else "packed")
    assert cpp.weight_layout(KernelOptions(amx=False)) == "packed"
    assert cpp.weight_layout(KernelOptions(packed=False)) == "row"


@pytest.mark.skipif(not AMX, reason="no bf16 kernels here (AMX-BF16 or AVX512-BF16)")
def test_amx_linear_is_invariant_across_row_and_thread_counts(cpp: CppOps) -> None:
    """Rows 1..70 (every row tile shape), 300 (two AMX row blocks), on 1, 2, 3 threads, 21
    column tiles (odd, and column groups of 8 and 4 with a remainder on either thread):
    each row's bits alone; the input rounded to bf16 first."""
    x, w = _randn(300, 3 * AMX_K, seed=21), _randn(21 * PACK, 3 * AMX_K, seed=22).bfloat16()
    b = _randn(21 * PACK, seed=23)
    packed = pack(w, "amx")
    assert layout_of(packed) == "amx" and torch.equal(unpack(packed), w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = cpp.linear(x, packed, b)
        assert torch.equal(cpp.linear(x, packed, None) + b, together)  # bias added last
        assert torch.equal(cpp.linear(x.bfloat16().float(), packed, b), together)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for n in range(1, 71):
                assert torch.equal(cpp.linear(x[:n], packed, b), together[:n]), (threads, n)
            for i in range(0, 300, 23):
                assert torch.equal(cpp.linear(x[i : i + 1], packed, b)[0], together[i]), i
            assert torch.equal(cpp.linear(x, packed, b), together)
    finally:
        torch.set_num_threads(before)
    expected = x.bfloat16().float() @ w.float().T + b
    torch.testing.assert_close(together, expected, atol=1e-5, rtol=1e-5)
