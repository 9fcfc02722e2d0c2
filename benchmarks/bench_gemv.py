"""The linear kernels alone: one decode step's weight stream, with no Python model around it.

    python benchmarks/bench_gemv.py [--model smollm2-135m] [--rows 1,4,16] [--repeats 7] \
        [--threads N] [--baseline OTHER_step_cpu.cpp] [--json OUT.json]

Loads the model's linear weights (every layer's, then the vocabulary head: far more than
the caches, so they come from memory) in float32 and in bf16, and times one pass of
``dg_linear`` / ``dg_linear_bf16`` over all of them, in the model's order, for R rows.
``--baseline`` builds another version of ``step_cpu.cpp`` (e.g. ``git show
main:local_verifier/kernels/step_cpu.cpp > /tmp/main.cpp``) into the same process, and the
two libraries are timed in turn (order alternating), so that the machine's load hits both
alike; then whole 1-row decode steps of the model, each library's linear kernels swapped
into the step in turn. Reports ms per pass (best and median of ``--repeats``), the GB/s of weights streamed
(best pass), and the machine's read bandwidth (``bench_decode.read_bandwidth``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_decode import CONTEXT, read_bandwidth  # noqa: E402
from local_verifier.kernels import cpp, step_ops  # noqa: E402
from local_verifier.kernels.fused import FUSED_ENV  # noqa: E402
from local_verifier.kv_storage import KVStorage  # noqa: E402
from local_verifier.linear import Linear  # noqa: E402
from local_verifier.loader import LoadedModel, load_model  # noqa: E402
from local_verifier.model import SeqStep  # noqa: E402
from lookup.shared_library import build  # noqa: E402

Kernels = dict[torch.dtype, ctypes._CFuncPtr]


def kernels(library: ctypes.CDLL) -> Kernels:
    """The two linear entry points of a step library, typed."""
    found = {}
    for dtype, name in ((torch.float32, "dg_linear"), (torch.bfloat16, "dg_linear_bf16")):
        function = getattr(library, name)
        function.argtypes = cpp.SIGNATURES[name]
        function.restype = None
        found[dtype] = function
    return found


def baseline(source: Path) -> Kernels:
    """The linear kernels of another ``step_cpu.cpp``, built with the project's flags."""
    path, reason = build(source, cpp.CFLAGS, sorted(cpp._cpu_flags()))
    if path is None:
        raise SystemExit(f"baseline {source}: {reason}")
    return kernels(ctypes.CDLL(str(path)))


def one_pass(kernel: ctypes._CFuncPtr, weights: list[torch.Tensor], x: torch.Tensor) -> float:
    """Seconds of y = x @ w.T for every w in turn (x's first in_features columns)."""
    threads, n = torch.get_num_threads(), x.shape[0]
    y = torch.empty(n, max(w.shape[0] for w in weights))
    start = time.perf_counter()
    for w in weights:
        m, k = w.shape
        kernel(x.data_ptr(), w.data_ptr(), None, y.data_ptr(), n, k, m, threads)
    return time.perf_counter() - start


def decode_steps(lm: LoadedModel, sides: dict[str, Kernels], repeats: int) -> dict[str, list]:
    """Seconds of 1-row decode steps (after a ``CONTEXT``-token context) with each side's
    linear kernels swapped into the step's ops, alternating side by step. The steps run op
    by op (``DRAFTGATE_FUSED=0``): the fused stack calls its own library's kernels."""
    os.environ[FUSED_ENV] = "0"
    model, cfg = lm.model, lm.config
    ops = step_ops(lm.device, model.dtype)
    if not isinstance(ops, cpp.CppOps):
        raise SystemExit(f"the step runs {ops.name} kernels, not the C++ ones")
    kv = KVStorage(cfg, CONTEXT + 1, lm.device, model.dtype)
    tokens = torch.arange(CONTEXT + 1) % cfg.vocab_size
    context, new = torch.arange(CONTEXT), torch.arange(CONTEXT, CONTEXT + 1)
    model.step([SeqStep(tokens[:CONTEXT], context, context, context[:0], logits="none")], kv)
    seconds: dict[str, list] = {side: [] for side in sides}
    dtype = model.weight_dtype
    for i in range(repeats + 1):  # the first round is a warm-up
        for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
            ops._linear[dtype] = sides[side][dtype]
            start = time.perf_counter()
            model.step([SeqStep(tokens[CONTEXT:], new, new, context)], kv)
            if i:
                seconds[side].append(time.perf_counter() - start)
    ops._linear[dtype] = sides["this"][dtype]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None, help="another step_cpu.cpp")
    parser.add_argument("--threads", type=int, default=0, help="0: what the loader chose")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    library, reason = cpp.load_library()
    if library is None:
        raise SystemExit(f"no C++ kernels: {reason}")
    sides = {"this": kernels(library)}
    if args.baseline is not None:
        sides["baseline"] = baseline(args.baseline)
    report: dict = {"passes": []}
    for dtype in (torch.float32, torch.bfloat16):
        lm = load_model(args.model, dtype="bf16" if dtype == torch.bfloat16 else "float32")
        if args.threads:
            torch.set_num_threads(args.threads)
        weights = [m.weight.detach() for m in lm.model.modules() if isinstance(m, Linear)]
        gb = sum(w.numel() * w.element_size() for w in weights) / 1e9
        widest = max(w.shape[1] for w in weights)
        for rows in [int(r) for r in args.rows.split(",") if r]:
            x = torch.randn(rows, widest) * 0.1
            seconds: dict[str, list[float]] = {side: [] for side in sides}
            for side in sides:  # warm-up
                one_pass(sides[side][dtype], weights, x)
            for i in range(args.repeats):
                for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
                    seconds[side].append(one_pass(sides[side][dtype], weights, x))
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
        if len(sides) > 1:
            steps = decode_steps(lm, sides, 3 * args.repeats)
            for side, s in steps.items():
                entry = {
                    "side": side,
                    "dtype": str(dtype).removeprefix("torch."),
                    "decode_step_best_ms": round(min(s) * 1e3, 2),
                    "decode_step_median_ms": round(statistics.median(s) * 1e3, 2),
                }
                report["passes"].append(entry)
                print(json.dumps(entry), flush=True)
        del lm, weights
    report["threads"] = torch.get_num_threads()
    probes = read_bandwidth()
    report["bandwidth_gb_s"] = {k: round(v / 1e9, 1) for k, v in probes.items()}
    print(f"read bandwidth GB/s: {report['bandwidth_gb_s']}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
