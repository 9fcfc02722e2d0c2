"""The C++ attention kernel alone, on SmolLM2-135M's head geometry (9 query heads, 3 kv
heads, head_dim 64; one layer's K/V) and random data:

    python -m benchmarks.kernels.bench_attention [--repeats 3] [--baseline OLD_step_cpu.cpp] [--cold]

Per case (a 512-row causal prompt chunk after 0..7680 context keys: the chunks of 1k, 4k
and 8k prompts; decode rows after long contexts): the best wall ms and process CPU ms of a
call over ``--repeats`` (CPU time is the fairer figure on a shared machine; run with
OMP_WAIT_POLICY=passive so that idle threads do not spin) and GFLOP per CPU second (4
flops per query head, key and head dimension). ``--baseline`` builds another version of
``step_cpu.cpp`` and times it interleaved with this one (same process, same data, K in the
layout each version reads), with the largest output difference.
``--cold`` times each call on another of 30 layers' K/V after a 256 MiB read, as in a decode
step, whose weights stream through the caches between two layers' attention (the default
re-reads one layer's K/V from the cache).

``--serving`` times serving steps instead: 1-8 sequences of 1-16 rows each (chains and
draft trees) after 200-1,000 context keys in 16-slot pool blocks taken in random order; a
step is 30 layers' attention, each on its own K/V after a 9 MiB read (a layer's weights),
summed (wall seconds; a thread's CPU seconds with ``--threads 1``); every side on K/V in
4 KiB and in 2 MiB pages, interleaved step by step, outputs compared with torch.equal.
``--kv-dtype bfloat16`` stores K/V as the bf16 target does.
"""

from __future__ import annotations

import argparse
import ctypes
import random
import time
from pathlib import Path
from typing import NamedTuple

import torch

from local_verifier.devices import cpu_flags
from local_verifier.huge_pages import zeros as zeros_on_huge_pages
from local_verifier.kernels import cpp
from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kv_storage import key_tiles
from lookup.shared_library import build

HEADS, KV_HEADS, DIM, SLOTS = 9, 3, 64, 8192
COLD_LAYERS, COLD_READ = 30, 256 * 2**20  # --cold: K/V sets, bytes read between calls
CASES = [(512, c) for c in (0, 512, 1536, 3584, 7680)] + [(1, 1023), (1, 4095), (1, 8191)]


class Side(NamedTuple):
    """One version's kernels and the K layout it reads."""

    ops: cpp.CppOps
    tiled: bool  # K in KVStorage's key tiles (older sources read [slots, heads, dim] rows)


def stored(k: torch.Tensor, side: Side) -> torch.Tensor:
    """K of [..., slots, heads, dim] rows in the layout ``side`` reads."""
    return key_tiles(k) if side.tiled else k


def kernels(source: Path) -> Side:
    """The C++ kernels built from ``source``."""
    path, why = build(source, cpp.CFLAGS, sorted(cpu_flags()), cpp.parts_of(source))
    if path is None:
        raise RuntimeError(why)
    library = ctypes.CDLL(str(path))
    for name, argtypes in cpp.SIGNATURES.items():
        if not hasattr(library, name):  # an older source without the fused stack
            continue
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = None
    return Side(cpp.CppOps(library), "kKeyTile" in source.read_text())


SERVING_LAYERS, LAYER_READ, POOL_BLOCK = 30, 9 * 2**20, 16
# (sequences, rows per sequence, draft trees?) per serving case; contexts 200-1,000 keys
SERVING = [
    (1, 1, False),
    (1, 4, False),
    (1, 16, True),
    (4, 2, False),
    (8, 1, False),
    (8, 2, False),
    (8, 4, True),
    (8, 8, True),
    (6, 16, True),
]


def _tree(rows: int, rng: random.Random) -> torch.Tensor:
    """A draft tree's mask: each row allows itself and the rows of a random parent's path."""
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    for i in range(rows):
        mask[i, i] = True
        if i:
            mask[i] |= mask[rng.randrange(i)]
    return mask


def serving_plan(seqs: int, rows: int, tree: bool, slots: int, rng: random.Random) -> AttentionPlan:
    """A step's plan: each sequence's keys in pool blocks drawn at random from ``slots``."""
    free = list(range(slots // POOL_BLOCK))
    rng.shuffle(free)
    contexts, news, masks = [], [], []
    for _ in range(seqs):
        ctx = rng.randrange(200, 1001)
        blocks = [free.pop() for _ in range(-(-(ctx + rows) // POOL_BLOCK))]
        keys = torch.tensor([b * POOL_BLOCK + o for b in blocks for o in range(POOL_BLOCK)])
        contexts.append(keys[:ctx])
        news.append(keys[ctx : ctx + rows])
        masks.append(_tree(rows, rng) if tree else None)
    return AttentionPlan.build(contexts, news, masks)


def on_huge_pages(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` in 2 MiB pages (as KVStorage allocates its K/V)."""
    return zeros_on_huge_pages(tuple(x.shape), x.dtype).copy_(x)


def serving(sides: dict[str, Side], repeats: int, dtype: torch.dtype) -> None:
    """Times --serving's cases (see the module docstring) for each side's kernels on K/V in
    4 KiB pages and in 2 MiB ones, K/V in ``dtype``."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    slots, shape = 8192, (SERVING_LAYERS, 8192, KV_HEADS, DIM)
    k_rows = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    v_huge = on_huge_pages(v_cache)
    runs = {}
    for name, side in sides.items():
        k_cache = stored(k_rows, side)
        runs[f"{name}/4k"] = side.ops, (k_cache, v_cache)
        runs[f"{name}/2m"] = side.ops, (on_huge_pages(k_cache), v_huge)
    first = next(iter(runs))
    # one thread: its CPU seconds (steadier on a shared machine); more: wall seconds
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    weights = torch.ones(SERVING_LAYERS, LAYER_READ // 4)
    ratios: dict[str, list[float]] = {run: [] for run in runs}
    for seqs, rows, tree in SERVING:
        plan = serving_plan(seqs, rows, tree, slots, rng)
        q = torch.randn(seqs * rows, HEADS, DIM, generator=gen)
        best = dict.fromkeys(runs, float("inf"))
        same = True
        for _ in range(repeats):  # interleaved: load changes hit every run alike
            outs = {}
            for run, (ops, (k_cache, v_cache)) in runs.items():
                seconds = 0.0
                for layer in range(SERVING_LAYERS):
                    weights[layer].sum()
                    start = clock()
                    outs[run] = ops.attention(q, k_cache[layer], v_cache[layer], plan)
                    seconds += clock() - start
                best[run] = min(best[run], seconds)
            same &= all(torch.equal(o, outs[first]) for o in outs.values())
        line = f"seqs {seqs} x rows {rows:2d} {'tree ' if tree else 'chain'}"
        line += f" keys {int(plan.key_start[-1]):5d} | bitwise equal {same} |"
        for run, seconds in best.items():
            line += f" {run} {seconds * 1e3:6.2f}"
            ratios[run].append(seconds / best[first])
        print(line + " ms", flush=True)
    means = " ".join(f"{run} {sum(r) / len(r):.3f}" for run, r in ratios.items())
    print(f"mean ratio to {first}: {means}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another step_cpu.cpp to time against")
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    parser.add_argument("--cold", action="store_true", help="K/V from memory, not the cache")
    parser.add_argument("--serving", action="store_true", help="serving steps (see above)")
    parser.add_argument("--kv-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="--serving's K/V (the bf16 target stores bfloat16)")  # fmt: skip
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sides = {"this": kernels(cpp.SOURCE)}
    if args.baseline:
        sides = {"baseline": kernels(args.baseline), **sides}
    if args.serving:
        print(f"threads {torch.get_num_threads()}")
        return serving(sides, args.repeats, getattr(torch, args.kv_dtype))
    gen = torch.Generator().manual_seed(0)
    layers = COLD_LAYERS if args.cold else 1
    k_rows = torch.randn(layers, SLOTS, KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(layers, SLOTS, KV_HEADS, DIM, generator=gen)
    k_stored = {name: stored(k_rows, side) for name, side in sides.items()}
    evict = torch.ones(COLD_READ // 4) if args.cold else None
    calls = 0
    print(f"threads {torch.get_num_threads()}")
    for rows, ctx in CASES:
        q = torch.randn(rows, HEADS, DIM, generator=gen)
        plan = AttentionPlan.build([torch.arange(ctx)], [torch.arange(ctx, ctx + rows)], [None])
        outs = {name: side.ops.attention(q, k_stored[name][0], v_cache[0], plan)
                for name, side in sides.items()}  # fmt: skip
        wall: dict[str, float] = dict.fromkeys(sides, float("inf"))
        cpu_s = dict(wall)
        for _ in range(args.repeats):  # interleaved: load changes hit both alike
            for side, (ops, _) in sides.items():
                layer, calls = calls % layers, calls + 1
                if evict is not None:
                    evict.sum()
                start, cpu = time.perf_counter(), time.process_time()
                ops.attention(q, k_stored[side][layer], v_cache[layer], plan)
                wall[side] = min(wall[side], time.perf_counter() - start)
                cpu_s[side] = min(cpu_s[side], time.process_time() - cpu)
        flops = rows * (ctx + (rows + 1) / 2) * HEADS * DIM * 4
        line = f"rows {rows:4d} context {ctx:5d}"
        for side in sides:
            line += f" | {side} {wall[side] * 1e3:8.2f} ms wall {cpu_s[side] * 1e3:8.2f} ms cpu"
        if "baseline" in sides:
            diff = float((outs["this"] - outs["baseline"]).abs().max())
            ratio = cpu_s["this"] / cpu_s["baseline"]
            line += f" | cpu this / baseline {ratio:.2f} | max diff {diff:.1e}"
        line += f" | this {flops / cpu_s['this'] / 1e9:6.1f} GFLOP per cpu s"
        print(line, flush=True)


if __name__ == "__main__":
    main()
