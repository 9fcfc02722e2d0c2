"""The bf16 linear kernel alone (``dg_linear_amx``: AMX tiles, or AVX512-BF16 dot products
where AMX is absent) on SmolLM2-135M's shapes, random weights:

    python -m benchmarks.kernels.bench_amx_linear [--rows 16,64,512] [--threads 2] [--repeats 4] \
        [--baseline OLD_step_cpu.cpp] [--packed] [--passes N] [--json OUT.json]

Per row count: each of a step's linear layers (qkv with its bias, o, gate_up, down: 30
layers' distinct weights, so that they stream from memory as in a step; the head: 2
copies) called in turn, every build once per weight, the builds' order rotating; per shape,
the fastest call over layers and repeats (the least disturbed on a shared machine), and a
step's linear time as 30 x each layer's + the head's. ``--baseline`` builds another
``step_cpu.cpp`` to time against in the same process, and checks that both give the same
bits (``equal``). ``--packed`` times the float32 kernel on the same weights in the
``packed`` layout too (what ``DRAFTGATE_AMX=0`` runs; other bits, so not in ``equal``).
A weight called again soon after may still be in the last-level cache, which flatters the
fastest call where the kernel waits on memory. ``--passes N`` also times N whole passes per
build in a step's order (layer by layer, then the head: every weight read once, as in a
step), the builds alternating pass by pass, and reports each build's median and fastest
pass.
Needs a CPU with AMX-BF16 or AVX512-BF16.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from local_verifier.devices import cpu_flags
from local_verifier.kernels import cpp
from local_verifier.kernels.packing import pack
from lookup.shared_library import build

LAYERS, DIM, HIDDEN, VOCAB, QKV = 30, 576, 1536, 49152, 960
SHAPES = {"qkv": (QKV, DIM), "o": (DIM, DIM), "gate_up": (2 * HIDDEN, DIM), "down": (DIM, HIDDEN)}
SHAPES["head"] = (VOCAB, DIM)


def linear_amx(source: Path) -> ctypes._CFuncPtr:
    """``dg_linear_amx`` of the kernels built from ``source``."""
    path, why = build(source, cpp.CFLAGS, sorted(cpu_flags()), cpp.parts_of(source))
    if path is None:
        raise RuntimeError(why)
    library = ctypes.CDLL(str(path))
    if library.dg_bf16_kernels() == 0:
        raise RuntimeError("this CPU (or build) has no bf16 kernels")
    function = library.dg_linear_amx
    function.argtypes = cpp.SIGNATURES["dg_linear_bf16"]
    function.restype = None
    return function


@dataclass
class Calls:
    """Each build's calls on the benchmark's weights, for the rows of ``x``."""

    sides: dict[str, Any]
    weights: dict[str, dict[str, list[torch.Tensor]]]
    layouts: dict[str, str]
    bias: torch.Tensor
    threads: int
    x: dict[int, torch.Tensor]
    outs: dict[str, dict[str, torch.Tensor]]

    def timed(self, side: str, name: str, i: int) -> float:
        """Seconds of one call of ``side`` on layer ``i``'s weight ``name``."""
        m, k = SHAPES[name]
        x, y = self.x[k], self.outs[side][name]
        w = self.weights[self.layouts[side]][name][i]
        b = self.bias.data_ptr() if name == "qkv" else None
        start = time.perf_counter()
        self.sides[side](x.data_ptr(), w.data_ptr(), b, y.data_ptr(), len(x), k, m, self.threads)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,64,512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--baseline", type=Path, help="another step_cpu.cpp to time against")
    parser.add_argument("--packed", action="store_true", help="the float32 kernel, too")
    parser.add_argument("--passes", type=int, default=0, help="whole passes in a step's order")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sides = {"this": linear_amx(cpp.SOURCE)}
    if args.baseline:
        sides["baseline"] = linear_amx(args.baseline)
    if args.packed:
        sides["packed"] = cpp.load_library()[0].dg_linear_packed_bf16
    torch.manual_seed(0)
    rows = {
        name: [
            (torch.randn(m, k) * 0.05).to(torch.bfloat16)
            for _ in range(2 if name == "head" else LAYERS)
        ]
        for name, (m, k) in SHAPES.items()
    }
    layouts = {side: "packed" if side == "packed" else "amx" for side in sides}
    weights = {
        layout: {name: [pack(w, layout) for w in ws] for name, ws in rows.items()}
        for layout in set(layouts.values())
    }
    del rows
    bias = torch.randn(QKV)
    report: dict[str, dict] = {}
    for n in [int(r) for r in args.rows.split(",")]:
        x = {k: torch.randn(n, k) for k in (DIM, HIDDEN)}
        outs = {
            side: {name: torch.empty(n, m) for name, (m, _) in SHAPES.items()} for side in sides
        }
        best = {side: dict.fromkeys(SHAPES, float("inf")) for side in sides}

        timed = Calls(sides, weights, layouts, bias, args.threads, x, outs).timed

        order = list(sides)
        for _ in range(args.repeats):
            for name in SHAPES:
                for i in range(len(weights["amx"][name])):
                    order = order[1:] + order[:1]
                    for side in order:
                        best[side][name] = min(best[side][name], timed(side, name, i))
        equal = all(
            torch.equal(outs["this"][s], o[s])
            for side, o in outs.items()
            if side != "packed"
            for s in SHAPES
        )
        flops = 2 * n * sum(m * k * (1 if s == "head" else LAYERS) for s, (m, k) in SHAPES.items())
        report[str(n)] = {"equal": equal}
        if args.passes:
            layer = [name for name in SHAPES if name != "head"]
            passes: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(args.passes):
                for side in sides:
                    t = sum(timed(side, name, i) for i in range(LAYERS) for name in layer)
                    t += sum(timed(side, "head", i) for i in range(len(weights["amx"]["head"])))
                    passes[side].append(t)
            for side, times in passes.items():
                median, fastest = statistics.median(times) * 1e3, min(times) * 1e3
                report[str(n)][f"{side}_passes_ms"] = {"median": median, "fastest": fastest}
                print(
                    f"{n:4d} rows, {side:8s}: whole pass median {median:7.2f} ms, "
                    f"fastest {fastest:7.2f} ms ({len(times)} passes)",
                    flush=True,
                )
        for side in sides:
            t = best[side]
            step = sum(t[s] * (1 if s == "head" else LAYERS) for s in SHAPES)
            report[str(n)][side] = {"step_ms": step * 1e3, "gflop_s": flops / step / 1e9} | {
                f"{s}_ms": t[s] * 1e3 for s in SHAPES
            }
            calls = " ".join(f"{s} {t[s] * 1e3:.3f}" for s in SHAPES)
            print(
                f"{n:4d} rows, {args.threads} threads, {side:8s}: step {step * 1e3:7.2f} ms "
                f"({flops / step / 1e9:5.0f} GFLOP/s) | ms per call: {calls} | equal {equal}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "rows": report}, indent=2))


if __name__ == "__main__":
    main()
