"""The linear kernels alone: one decode step's weight stream, with no Python model around it.

    python -m benchmarks.kernels.bench_gemv [--model smollm2-135m] [--rows 1,4,16] [--repeats 7] \
        [--threads N] [--baseline OTHER_step_cpu.cpp] [--steps] [--json OUT.json]

Loads the model's linear weights (every layer's, then the vocabulary head: far more than
the caches, so they come from memory) in float32 and in bf16, row-major and packed (both
held for the comparison), and times one pass of the linear kernels over all of them, in
the model's order, for R rows: sides "packed" and "row-major" (this library; "amx", bf16
only, where the CPU has the AMX kernels: the bf16 weights in their layout), and with
``--baseline`` another version of ``step_cpu.cpp`` (e.g. ``git show
main:local_verifier/kernels/step_cpu.cpp > /tmp/main.cpp``) built into the same process:
sides "baseline row-major", and "baseline packed" if it has the packed kernels. The sides
are timed in turn (order alternating), so that the machine's load hits them alike.
``--steps``: then whole 1-row decode steps of two copies of the bf16 model, one packed and
one row-major, alternating.
Reports ms per pass (best and median of ``--repeats``), the GB/s of weights streamed (best
pass), and the machine's read bandwidth (``bench_decode.read_bandwidth``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.bench_decode import CONTEXT, read_bandwidth
from local_verifier.devices import cpu_flags
from local_verifier.kernels import cpp
from local_verifier.kernels.options import PACKED_ENV
from local_verifier.kernels.packing import (
    Layout,
    dense_shape,
    pack,
    packable,
)
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import SeqStep
from lookup.shared_library import build

Kernels = dict[tuple[torch.dtype, Layout], ctypes._CFuncPtr]  # (dtype, layout) -> kernel
ENTRY_POINTS: dict[tuple[torch.dtype, Layout], str] = {
    (torch.float32, "row"): "dg_linear",
    (torch.bfloat16, "row"): "dg_linear_bf16",
    (torch.float32, "packed"): "dg_linear_packed",
    (torch.bfloat16, "packed"): "dg_linear_packed_bf16",
    (torch.bfloat16, "amx"): "dg_linear_amx",
}


def kernels(library: ctypes.CDLL) -> Kernels:
    """The linear entry points a step library has (an older one: row-major only; the
    ``amx`` layout's only where it runs bf16 kernels: AMX, or AVX512-BF16 dot products),
    typed."""
    found = {}
    probe = getattr(library, "dg_bf16_kernels", None) or getattr(library, "dg_amx_available", None)
    amx = probe is not None and probe() != 0
    for key, name in ENTRY_POINTS.items():
        function = getattr(library, name, None)
        if function is not None and (key[1] != "amx" or amx):
            function.argtypes = {**cpp.SIGNATURES, **cpp.AMX_SIGNATURES}[name]
            function.restype = None
            found[key] = function
    return found


def baseline(source: Path) -> Kernels:
    """The linear kernels of another ``step_cpu.cpp``, built with the project's flags."""
    path, reason = build(source, cpp.CFLAGS, sorted(cpu_flags()), cpp.parts_of(source))
    if path is None:
        raise SystemExit(f"baseline {source}: {reason}")
    return kernels(ctypes.CDLL(str(path)))


def one_pass(kernel: ctypes._CFuncPtr, weights: list[torch.Tensor], x: torch.Tensor) -> float:
    """Seconds of y = x @ w.T for every w in turn (x's first in_features columns)."""
    threads, n = torch.get_num_threads(), x.shape[0]
    y = torch.empty(n, max(dense_shape(w)[0] for w in weights))
    start = time.perf_counter()
    for w in weights:
        m, k = dense_shape(w)
        kernel(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), n, k, m, threads)
    return time.perf_counter() - start


Sides = dict[str, tuple[Kernels, Layout]]  # name -> (kernels, the weights' layout)


def passes(
    sides: Sides,
    layouts: dict[Layout, list[torch.Tensor]],
    dtype: torch.dtype,
    x: torch.Tensor,
    repeats: int,
) -> dict[str, list[float]]:
    """Seconds of ``repeats`` passes per side that has a kernel for ``dtype``, the sides in
    turn (order alternating)."""
    sides = {name: side for name, side in sides.items() if (dtype, side[1]) in side[0]}

    def timed(side: str) -> float:
        found, layout = sides[side]
        return one_pass(found[dtype, layout], layouts[layout], x)

    for side in sides:  # warm-up
        timed(side)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(repeats):
        for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
            seconds[side].append(timed(side))
    return seconds


def decode_steps(models: dict[str, LoadedModel], repeats: int) -> dict[str, list]:
    """Seconds of 1-row decode steps (after a ``CONTEXT``-token context) of each model, its
    weights packed or not as ``models``' key says (``KernelOptions.packed``),
    alternating model by step (order reversed every round)."""
    seconds: dict[str, list] = {side: [] for side in models}
    runs = {}
    for side, lm in models.items():
        model, cfg = lm.model, lm.config
        model.kernel_options = replace(model.kernel_options, packed=side == "packed")
        kv = KVStorage(cfg, CONTEXT + 1, lm.device, model.kv_dtype)
        tokens = torch.arange(CONTEXT + 1) % cfg.vocab_size
        context, new = torch.arange(CONTEXT), torch.arange(CONTEXT, CONTEXT + 1)
        model.step([SeqStep(tokens[:CONTEXT], context, context, context[:0], logits="none")], kv)
        runs[side] = (model, kv, SeqStep(tokens[CONTEXT:], new, new, context))
    for i in range(repeats + 1):  # the first round is a warm-up
        for side in list(models)[:: 1 if i % 2 == 0 else -1]:
            model, kv, step = runs[side]
            start = time.perf_counter()
            model.step([step], kv)
            if i:
                seconds[side].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None, help="another step_cpu.cpp")
    parser.add_argument("--threads", type=int, default=0, help="0: what the loader chose")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--steps", action="store_true", help="also whole 1-row decode steps")
    args = parser.parse_args()

    library, reason = cpp.load_library()
    if library is None:
        raise SystemExit(f"no C++ kernels: {reason}")
    this = kernels(library)
    sides: Sides = {"packed": (this, "packed"), "row-major": (this, "row"), "amx": (this, "amx")}
    if args.baseline is not None:
        other = baseline(args.baseline)
        if (torch.float32, "packed") in other:
            sides["baseline packed"] = (other, "packed")
        sides["baseline row-major"] = (other, "row")
    report: dict = {"passes": []}
    for dtype in (torch.float32, torch.bfloat16):
        spec = "bf16" if dtype == torch.bfloat16 else "float32"
        os.environ[PACKED_ENV] = "0"
        lm = load_model(args.model, dtype=spec)
        os.environ.pop(PACKED_ENV)
        if args.threads:
            torch.set_num_threads(args.threads)
        weights = [m.weight.detach() for m in lm.model.modules() if isinstance(m, Linear)]
        # float32 packed too (the model packs bf16 only)
        tiled = [w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0 for w in weights]
        packed = [pack(w) if t else w for w, t in zip(weights, tiled, strict=True)]
        amx = [pack(w, "amx") if packable(w, "amx") else w for w in weights]
        layouts: dict[Layout, list[torch.Tensor]] = {"row": weights, "packed": packed, "amx": amx}
        gb = sum(w.numel() * w.element_size() for w in weights) / 1e9
        widest = max(w.shape[1] for w in weights)
        for rows in [int(r) for r in args.rows.split(",") if r]:
            x = torch.randn(rows, widest) * 0.1
            seconds = passes(sides, layouts, dtype, x, args.repeats)
            for side, s in seconds.items():
                entry = {
                    "side": side,
                    "dtype": str(dtype).removeprefix("torch."),
                    "rows": rows,
                    "weight_gb": round(gb, 3),
                    "best_ms": round(min(s) * 1e3, 2),
                    "median_ms": round(statistics.median(s) * 1e3, 2),
                    "gb_s": round(gb / min(s), 1),
                }
                report["passes"].append(entry)
                print(json.dumps(entry), flush=True)
        del layouts, packed, amx
        if args.steps and dtype == torch.bfloat16:  # the model packs bf16 weights only
            packed_lm = load_model(args.model, dtype=spec, tune_threads=False)
            steps = decode_steps({"packed": packed_lm, "row-major": lm}, 3 * args.repeats)
            for side, s in steps.items():
                entry = {
                    "side": side,
                    "dtype": str(dtype).removeprefix("torch."),
                    "decode_step_best_ms": round(min(s) * 1e3, 2),
                    "decode_step_median_ms": round(statistics.median(s) * 1e3, 2),
                }
                report["passes"].append(entry)
                print(json.dumps(entry), flush=True)
            del packed_lm
        del lm, weights
    report["threads"] = torch.get_num_threads()
    probes = read_bandwidth()
    report["bandwidth_gb_s"] = {k: round(v / 1e9, 1) for k, v in probes.items()}
    print(f"read bandwidth GB/s: {report['bandwidth_gb_s']}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
