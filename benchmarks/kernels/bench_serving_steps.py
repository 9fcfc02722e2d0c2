"""Where a served step's time goes: the engine in-process on a workload, by step size.

    python -m benchmarks.kernels.bench_serving_steps [--workload PATH] \
        --concurrency 1,4,8 --max-tokens 128 [--dtype bf16] [--threads 2] --json OUT \
        [--baseline OLD_step_cpu.cpp --rounds N]

Runs the serving engine without HTTP (``bench_engine.throughput``: closed loop, each
prompt once, drafts on) after one warm pass without drafts (the prefix cache then holds
the prompts, as in ``bench_serving.py``'s identity pass). Every forward step is timed
whole and by the fused stack's own clock (linear, head, attention, row ops; ``other`` is
the rest of ``Transformer.step``: Python, embedding, the plan), and the steps are grouped
by their row count. Output tokens/s per level is reported beside them: with nothing but
the engine on the machine, it is the ceiling the HTTP benchmark can reach.

``--baseline`` compares two builds of the kernels instead, side by side in one process (the
same model, prefix cache and prompts): each of ``--rounds`` rounds runs every level on this
checkout's ``step_cpu.cpp`` and on the baseline's, in alternating order, and reports output
tokens/s and this / baseline per round.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.bench_engine import throughput
from benchmarks.harness import workload
from local_verifier import kernels
from local_verifier.engine import Engine
from local_verifier.kernels import cpp
from local_verifier.kernels.fused import PROFILE_KINDS
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import SeqStep, Transformer

BUCKETS = ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 4096))


def summarise(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per bucket of rows: step count, mean sequences/rows/context keys, median ms by part."""
    out = []
    for lo, hi in BUCKETS:
        group = [s for s in steps if lo <= s["rows"] <= hi]
        if not group:
            continue
        row: dict[str, Any] = {"rows": f"{lo}-{hi}", "steps": len(group)}
        for key in ("seqs", "rows", "context"):
            row[f"mean_{key}"] = round(statistics.mean(s[key] for s in group), 1)
        for part in (*PROFILE_KINDS, "other", "total"):
            row[f"{part}_ms"] = round(statistics.median(s[part] for s in group) * 1e3, 2)
        out.append(row)
    return out


def library(source: Path) -> ctypes.CDLL:
    """The kernels built from ``source``."""
    lib, why = cpp.build_library(source)
    if lib is None:
        raise SystemExit(f"cannot build {source}: {why}")
    return lib


def run_on(lm: LoadedModel, lib: ctypes.CDLL) -> None:
    """Runs ``lm``'s next steps on ``lib``'s kernels (its layer stack built again)."""
    cpp._loaded = (lib, "")
    kernels._ops_for.cache_clear()
    lm.model._stack = None


def side_by_side(lm: LoadedModel, engine: Engine, prompts: list[list[int]], args: Any) -> None:
    """--baseline: this checkout's kernels against the baseline's, rounds alternating."""
    libs = {"this": library(cpp.SOURCE), "baseline": library(args.baseline)}
    levels = [int(x) for x in args.concurrency.split(",")]
    rounds = []
    for r in range(args.rounds):
        tok_s: dict[str, dict[int, float]] = {}
        for side in ("this", "baseline") if r % 2 == 0 else ("baseline", "this"):
            run_on(lm, libs[side])
            tok_s[side] = {c: throughput(engine, prompts, args.max_tokens, c, True) for c in levels}
        ratio = {c: tok_s["this"][c] / tok_s["baseline"][c] for c in levels}
        rounds.append({"round": r + 1, "output_tok_s": tok_s, "this_over_baseline": ratio})
        print(json.dumps(rounds[-1]), flush=True)
    report = {"dtype": str(lm.dtype).removeprefix("torch."), "threads": args.threads}
    report["baseline"] = args.baseline.name  # the file, not where it lay
    args.json.write_text(json.dumps({**report, "rounds": rounds}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default=None, help="float32 or bf16 (default: the machine's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--baseline", type=Path, help="another step_cpu.cpp, side by side")
    parser.add_argument("--rounds", type=int, default=3, help="--baseline's rounds")
    args = parser.parse_args()

    lm = load_model("smollm2-135m", dtype=args.dtype, tune_threads=False)
    torch.set_num_threads(args.threads)
    engine = Engine(lm)
    items = workload(args.workload)
    prompts = [lm.tokenizer.encode(lm.tokenizer.apply_chat_template(r.messages)) for r in items]
    if args.baseline is not None:
        throughput(engine, prompts, args.max_tokens, 1, False)  # warm: the prefix cache
        return side_by_side(lm, engine, prompts, args)
    stack = lm.model.fused_stack()
    if stack is None:
        raise SystemExit("the fused C++ stack is not in use: no kernel clock to read")
    steps: list[dict[str, Any]] = []
    step = Transformer.step

    def timed(self: Transformer, seqs: list[SeqStep], kv: Any) -> list[torch.Tensor]:
        stack.profile = torch.zeros(len(PROFILE_KINDS), dtype=torch.float64)
        began = time.perf_counter()
        out = step(self, seqs, kv)
        total = time.perf_counter() - began
        parts = dict(zip(PROFILE_KINDS, stack.profile.tolist(), strict=True))
        steps.append(
            {
                "seqs": len(seqs),
                "rows": sum(len(s.tokens) for s in seqs),
                "context": sum(len(s.context_slots) for s in seqs),
                **parts,
                "other": total - sum(parts.values()),
                "total": total,
            }
        )
        return out

    Transformer.step = timed  # type: ignore[method-assign]
    throughput(engine, prompts, args.max_tokens, 1, False)  # warm: the prefix cache
    levels = []
    for c in (int(x) for x in args.concurrency.split(",")):
        steps.clear()
        tok_s = throughput(engine, prompts, args.max_tokens, c, True)
        level = {"concurrency": c, "output_tok_s": round(tok_s, 1), "by_rows": summarise(steps)}
        print(json.dumps(level), flush=True)
        levels.append(level)
    report = {"dtype": str(lm.dtype).removeprefix("torch."), "threads": args.threads}
    args.json.write_text(json.dumps({**report, "levels": levels}, indent=2) + "\n")


if __name__ == "__main__":
    main()
