"""GGUF quantized weights: the kernels' speed per type, and the numerics of ``dtype="native"``.

    python -m benchmarks.kernels.bench_quant [--shape 8192x2048] [--rows 1,64] [--repeats 7] \
        [--threads N] [--types Q8_0,Q4_1,...] [--json OUT.json]
    python -m benchmarks.kernels.bench_quant --numerics smollm2-135m gemma3-270m [FILE.gguf] \
        [--prompts 6] [--tokens 32] [--json OUT.json]
    python -m benchmarks.kernels.bench_quant --decode smollm2-135m [--dtypes native,bf16,float32] \
        [--prompts 6] [--tokens 32] [--rows 1,16,64] [--repeats 7] [--threads N] [--clock cpu] \
        [--json OUT.json]

Kernels: per type, one product y = x @ w.T over a weight of ``--shape`` (M x K, random
blocks; the default, a 1B model's MLP layer, is 9-18 MB by type, which a 32 MiB L3 holds:
take a larger shape for figures from memory) for each row count, three sides timed in turn
(order alternating): ``int8`` (the step's kernel, ``cpu/quant.h``: activations quantized per block
of 32, integer dot products), ``f32`` (``bench_quant_f32.cpp``: the same blocks decoded in
registers to float32 and multiplied with float32 activations by FMA), and ``bf16`` (the same
weight dequantized to bf16 on the step's bf16 kernels, as ``dtype="bf16"`` holds it). Reports
ms per product (best, median) and the weight's GB/s (best).

Numerics (``--numerics``): per model, ``dtype="native"`` against the same file dequantized to
float32 (``dtype="float32"``) on the first ``--prompts`` workload prompts (chat template):
the file's linear types, the top-1 agreement and the largest logit difference over every
prompt position (one prefill step each), and greedy agreement (``--tokens`` tokens of plain
decoding each side: prompts identical throughout, mean common prefix).

Decode (``--decode``): the model loaded once per ``--dtypes`` entry, then, interleaved (order
alternating), plain greedy decoding of ``--tokens`` tokens on each of the first ``--prompts``
workload prompts (decode tokens/s: the tokens after the first over the time after the
prompt's step; ``--prompts 0``: steps only) and ``--repeats`` steps of each ``--rows`` count (a chain of R rows after a
128-token context: a verify step's shape; ms per step, best and median), with native's best
step over bf16's per row count where both are run. ``--clock cpu`` times the process's CPU
seconds instead of wall seconds: with ``--threads 1``, a figure that other work sharing the
machine barely moves.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from benchmarks.harness import workload
from local_verifier.devices import cpu_flags
from local_verifier.kernels import cpp
from local_verifier.kernels.cpp import CppOps, load_library
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import QUANT_TYPES, dequantized, layout_of, quant_type
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import SeqStep
from lookup.shared_library import build

ALTERNATIVE = Path(__file__).with_name("bench_quant_f32.cpp")
SCALE_TOP = {"Q4_K": 15 * 63, "Q5_K": 31 * 63, "Q6_K": 32 * 127}


def random_weight(m: int, k: int, qtype: GGMLQuantizationType, seed: int = 0) -> torch.Tensor:
    """[m, k] of ``qtype`` in the ``quant`` layout: random fields, scales keeping values small."""
    size, values = QUANT_TYPES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (m, k // values, size), dtype=np.uint8)
    scale = (rng.random((m, k // values)) * 0.01 / SCALE_TOP.get(qtype.name, 16)).astype(np.float16)
    at = 208 if qtype.name == "Q6_K" else 0
    blocks[..., at : at + 2] = scale.view(np.uint8).reshape(m, -1, 2)
    if qtype.name in ("Q4_1", "Q4_K", "Q5_K"):
        blocks[..., 2:4] = scale.view(np.uint8).reshape(m, -1, 2)
    return torch.from_numpy(blocks)


def alternative() -> Any:
    path, reason = build(ALTERNATIVE, cpp.CFLAGS, sorted(cpu_flags()), cpp.parts_of(cpp.SOURCE))
    if path is None:
        raise SystemExit(f"{ALTERNATIVE.name}: {reason}")
    function = ctypes.CDLL(str(path)).dg_linear_quant_f32
    function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int] * 2
    function.restype = ctypes.c_int
    return function


def kernels(args: argparse.Namespace) -> dict[str, Any]:
    library, why = load_library()
    if library is None:
        raise SystemExit(f"no C++ kernels: {why}")
    ops, f32 = CppOps(library), alternative()
    m, k = (int(d) for d in args.shape.split("x"))
    threads = torch.get_num_threads()
    results: dict[str, Any] = {}
    for name in args.types.split(","):
        qtype = GGMLQuantizationType[name]
        weight = random_weight(m, k, qtype)
        bf16 = Linear(k, m)
        bf16.weight.data = dequantized(weight).to(torch.bfloat16)
        bf16.set_layout(ops.weight_layout(KernelOptions()))
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            y = torch.empty(rows, m)
            sides: dict[str, Callable[[], object]] = {
                "int8": partial(ops.linear, x, weight, None),
                "f32": partial(
                    f32,
                    x.data_ptr(),
                    weight.data_ptr(),
                    y.data_ptr(),
                    rows,
                    k,
                    m,
                    int(qtype),
                    threads,
                ),
                "bf16": partial(ops.linear, x, bf16.weight, None),
            }
            seconds: dict[str, list[float]] = {side: [] for side in sides}
            for i in range(args.repeats + 1):  # the first round warms up
                for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
                    start = time.perf_counter()
                    sides[side]()
                    if i:
                        seconds[side].append(time.perf_counter() - start)
            nbytes = {"int8": weight.numel(), "f32": weight.numel(), "bf16": m * k * 2}
            row = {
                side: {
                    "best_ms": min(s) * 1e3,
                    "median_ms": statistics.median(s) * 1e3,
                    "weight_gb_s": nbytes[side] / min(s) / 1e9,
                }
                for side, s in seconds.items()
            }
            results[f"{name} rows={rows}"] = row
            print(
                f"{name:5} rows={rows:3}  "
                + "  ".join(
                    f"{s} {r['best_ms']:7.3f} ms ({r['weight_gb_s']:5.1f} GB/s)"
                    for s, r in row.items()
                ),
                flush=True,
            )
    return {"shape": args.shape, "threads": threads, "kernels": results}


def _prefill(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    kv = KVStorage(lm.config, len(ids), dtype=lm.model.kv_dtype)
    slots = torch.arange(len(ids))
    return lm.model.step([SeqStep(torch.tensor(ids), slots, slots, slots[:0])], kv)[0]


def _greedy(lm: LoadedModel, ids: list[int], n: int) -> list[int]:
    kv = KVStorage(lm.config, len(ids) + n, dtype=lm.model.kv_dtype)
    slots = torch.arange(len(ids))
    step = SeqStep(torch.tensor(ids), slots, slots, slots[:0], logits="last")
    out = [int(lm.model.step([step], kv)[0][-1].argmax())]
    for i in range(n - 1):
        at = torch.tensor([len(ids) + i])
        step = SeqStep(torch.tensor(out[-1:]), at, at, torch.arange(len(ids) + i))
        out.append(int(lm.model.step([step], kv)[0][-1].argmax()))
    return out


def numerics(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    items = workload(limit=args.prompts)
    for spec in args.numerics:
        native = load_model(spec, dtype="native", tune_threads=False)
        reference = load_model(spec, dtype="float32", tune_threads=False)
        types = Counter(
            quant_type(m.weight).name if layout_of(m.weight) == "quant" else "dequantized"
            for m in native.model.modules()
            if isinstance(m, Linear)
        )
        agree = total = 0
        largest = 0.0
        identical, prefix = 0, []
        for item in items:
            ids = native.tokenizer.encode(native.tokenizer.apply_chat_template(item.messages))
            ours, theirs = _prefill(native, ids), _prefill(reference, ids)
            agree += int((ours.argmax(-1) == theirs.argmax(-1)).sum())
            total += ours.shape[0]
            largest = max(largest, float((ours - theirs).abs().max()))
            a, b = _greedy(native, ids, args.tokens), _greedy(reference, ids, args.tokens)
            identical += a == b
            prefix.append(
                next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
            )
        results[spec] = {
            "linear_types": dict(types),
            "top1_agreement": agree / total,
            "largest_logit_diff": largest,
            "greedy_identical": f"{identical}/{len(items)}",
            "greedy_mean_common_prefix": statistics.mean(prefix),
            "tokens": args.tokens,
        }
        print(spec, json.dumps(results[spec]), flush=True)
    return {"numerics": results}


def _timed_greedy(lm: LoadedModel, ids: list[int], n: int, clock: Callable[[], float]) -> float:
    """Seconds of the ``n - 1`` one-row steps of greedy decoding after the prompt's step."""
    kv = KVStorage(lm.config, len(ids) + n, dtype=lm.model.kv_dtype)
    slots = torch.arange(len(ids))
    step = SeqStep(torch.tensor(ids), slots, slots, slots[:0], logits="last")
    token = int(lm.model.step([step], kv)[0][-1].argmax())
    start = clock()
    for i in range(n - 1):
        at = torch.tensor([len(ids) + i])
        step = SeqStep(torch.tensor([token]), at, at, torch.arange(len(ids) + i))
        token = int(lm.model.step([step], kv)[0][-1].argmax())
    return clock() - start


def _timed_rows(
    lm: LoadedModel, rows: int, clock: Callable[[], float], context: int = 128
) -> float:
    kv = KVStorage(lm.config, context + rows, dtype=lm.model.kv_dtype)
    tokens = torch.arange(context + rows) % lm.config.vocab_size
    slots = torch.arange(context + rows)
    lm.model.step(
        [SeqStep(tokens[:context], slots[:context], slots[:context], slots[:0], logits="none")], kv
    )
    new = slots[context:]
    step = SeqStep(tokens[context:], new, new, slots[:context])
    start = clock()
    lm.model.step([step], kv)
    return clock() - start


def decode(args: argparse.Namespace) -> dict[str, Any]:
    models = {
        d: load_model(args.decode, dtype=d, tune_threads=False) for d in args.dtypes.split(",")
    }
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    tokenizer = next(iter(models.values())).tokenizer
    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template(item.messages))
        for item in workload(limit=args.prompts)
    ]
    seconds: dict[str, float] = dict.fromkeys(models, 0.0)
    for i, ids in enumerate(prompts):
        for side in list(models)[:: 1 if i % 2 == 0 else -1]:
            seconds[side] += _timed_greedy(models[side], ids, args.tokens, clock)
    steps: dict[str, dict[int, list[float]]] = {side: {} for side in models}
    for rows in (int(r) for r in args.rows.split(",")):
        for i in range(args.repeats + 1):  # the first round warms up
            for side in list(models)[:: 1 if i % 2 == 0 else -1]:
                t = _timed_rows(models[side], rows, clock)
                if i:
                    steps[side].setdefault(rows, []).append(t)
    report: dict[str, Any] = {}
    for side in models:
        report[side] = {
            "decode_tok_s": len(prompts) * (args.tokens - 1) / seconds[side] if prompts else None,
            "step_ms": {
                rows: {"best": min(t) * 1e3, "median": statistics.median(t) * 1e3}
                for rows, t in steps[side].items()
            },
        }
        print(side, json.dumps(report[side]), flush=True)
    if "native" in models and "bf16" in models:  # below 1: native's step is the faster
        ratio = {
            rows: report["native"]["step_ms"][rows]["best"]
            / report["bf16"]["step_ms"][rows]["best"]
            for rows in steps["native"]
        }
        report["native_over_bf16"] = ratio
        print("native / bf16 step (best):", json.dumps({r: round(v, 3) for r, v in ratio.items()}))
    return {
        "model": args.decode,
        "threads": torch.get_num_threads(),
        "clock": args.clock,
        "decode": report,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8192x2048", help="M x K of the weight")
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--types", default=",".join(t.name for t in QUANT_TYPES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's count")
    parser.add_argument("--numerics", nargs="*", help="models: native against float32")
    parser.add_argument("--decode", help="a model: plain decoding and steps per --dtypes")
    parser.add_argument("--dtypes", default="native,bf16,float32")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="--decode's timer: wall seconds, or the process's CPU seconds (with --threads 1: "
        "what a step costs while other work shares the machine)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = {"decode": decode, "numerics": numerics}
    mode = next((m for m in modes if getattr(args, m)), None)
    report = modes[mode](args) if mode else kernels(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
