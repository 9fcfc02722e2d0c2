"""A forward step's time by row count on each backend of a device: torch's kernels, the
Triton kernels eager, and the Triton kernels replayed as CUDA graphs.

    python -m benchmarks.kernels.bench_step_backends --device cuda --dtype bf16 \
        --rows 1,2,4,8,16,32,64 --context 256 --json OUT
    python -m benchmarks.kernels.bench_step_backends --smoke --json OUT

One sequence holds ``--context`` committed tokens; a step adds ``rows`` new rows to it (a
prompt chunk or a draft chain), is run a few times to warm up (Triton compiles, graphs are
captured), then timed ``--repeats`` times with the device synchronised around each step;
the median is reported. Every backend steps the same model in the same process, one after
another. ``--smoke`` runs a tiny random model on the CPU (Triton under its interpreter),
to check that the benchmark runs, not what it measures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from benchmarks.harness import machine, write_json
from local_verifier.config import ModelConfig
from local_verifier.kernels.options import KernelOptions
from local_verifier.kv_storage import KVStorage
from local_verifier.model import SeqStep, Transformer

SMOKE_CFG = ModelConfig(
    vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96,
    max_seq_len=128,
)  # fmt: skip
BACKENDS = {
    "torch": KernelOptions(backend="torch"),
    "triton_eager": KernelOptions(backend="triton", graphs=False),
    "triton_graphs": KernelOptions(backend="triton", graphs=True),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_ms(
    model: Transformer, kv: KVStorage, context: int, rows: int, warmup: int, repeats: int
) -> float:
    """Median milliseconds of a step adding ``rows`` rows after ``context`` committed ones."""
    device = model.device
    tokens = torch.arange(rows) % model.config.vocab_size
    step = SeqStep(
        tokens,
        torch.arange(context, context + rows),
        torch.arange(context, context + rows),
        torch.arange(context),
        logits="all",
    )
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        began = time.perf_counter()
        model.step([step], kv)
        _sync(device)
        if i >= warmup:
            times.append((time.perf_counter() - began) * 1e3)
    return statistics.median(times)


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    if args.smoke:
        model = Transformer.from_config(SMOKE_CFG, device=device, dtype=dtype)
    else:
        from local_verifier.loader import load_model

        model = load_model(args.model, device=args.device, dtype=args.dtype).model
    cfg = model.config
    kv = KVStorage(cfg, args.context + max(args.rows), device=device, dtype=model.kv_dtype)
    prefill = SeqStep(
        torch.arange(args.context) % cfg.vocab_size,
        torch.arange(args.context),
        torch.arange(args.context),
        torch.arange(0),
        logits="none",
    )
    backends = [b for b in BACKENDS if device.type == "cuda" or b != "triton_graphs"]
    results: dict[str, dict[str, float]] = {}
    for name in backends:
        model.kernel_options = replace(BACKENDS[name])
        model.step([prefill], kv)
        results[name] = {
            str(r): step_ms(model, kv, args.context, r, args.warmup, args.repeats)
            for r in args.rows
        }
        print(name, results[name], flush=True)
    return {
        "machine": machine(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "model": "smoke" if args.smoke else args.model,
        "dtype": args.dtype,
        "context": args.context,
        "step_ms": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "float32"])
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    args.rows = [int(r) for r in args.rows.split(",")]
    if args.smoke:
        args.device, args.dtype, args.rows = "cpu", "float32", [1, 4]
        args.context, args.warmup, args.repeats = 16, 1, 2
    if args.device == "cpu":  # the Triton kernels run on CPU tensors only interpreted
        os.environ.setdefault("TRITON_INTERPRET", "1")
    write_json(args.json, run(args))


if __name__ == "__main__":
    main()
