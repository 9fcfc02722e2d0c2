"""The cost of one forward step, and plain greedy decoding against transformers.

    python -m benchmarks.bench_decode [--workload WORKLOAD.jsonl] --max-tokens 64 \
        --json /tmp/bench_decode.json [--limit 4] [--rows 1,4,16,64] \
        [--prefill 1024,4096,8192] [--model smollm2-135m] [--dtype float32] [--smoke]

``--dtype bf16`` measures the bf16 target (bf16 weights, float32 activations on the CPU),
against transformers computing in fp32 on the same bf16-rounded weights.

Reports:
- the machine's sustained read bandwidth (the fastest of several ``--bandwidth-gib`` reductions, each
  best of 5: a float32 sum alone can fall short of the memory) and the physical floor
  of a decode step: the bytes of every weight matrix a token reads (all but the embedding
  table; half as many in bf16) over that bandwidth; the 1-row step as a fraction of it
  (floor / step);
- ms per step of R rows (a chain verify of R rows after a 128-token context) for each R
  (with ``--ab N``, also on the fused C++ stack and the per-op path, N rounds interleaved;
  with ``--ab-bf16 N``, with ``DRAFTGATE_AMX`` 0 and 1, N rounds interleaved);
- where the time of a 1-row step and of a 512-row prompt chunk goes: ms per step in each
  kernel (linear layers, the vocabulary head, attention, RMSNorm, rotary + K/V store,
  SwiGLU), and the rest (Python, embedding, the attention plan); timed inside the fused C++
  stack's call, or around each call on the per-op path (``DRAFTGATE_FUSED=0``);
- prompt processing at each length (tokens/s, in chunks of ``--chunk`` rows; tokens per
  CPU second of the process, the fairer figure on a shared machine with one thread; the
  share of the time in the attention kernel; the growth of the process's peak RSS: flat
  memory means no n x n attention matrix);
- per prompt: prefill seconds and decode tokens/s of ours and of transformers, interleaved
  (order alternating), and whether the greedy token ids are identical; transformers runs in
  a process of its own (``harness.TransformersPeer``), so ours is measured as a user runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import torch

import local_verifier.model
from benchmarks.harness import TransformersPeer, parse, workload, write_json
from gateway.audit.workload import WorkloadItem
from local_verifier.kernels import StepOps
from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.fused import PROFILE_KINDS
from local_verifier.kernels.packing import layout_of
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import SeqStep
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain

SMOKE = (
    *("--limit", "1", "--max-tokens", "8", "--rows", "1,4", "--repeats", "1"),
    *("--prefill", "256", "--chunk", "128", "--bandwidth-gib", "0.0625", "--threads", "1"),
)
CONTEXT = 128  # committed tokens before each timed step


# (dtype, reduction): which one reads fastest depends on the CPU and the torch build (a
# float32 sum has measured ~32 GB/s where a bf16 sum read ~57), so the floor takes the best
BANDWIDTH_PROBES = {
    "float32 sum": (torch.float32, torch.sum),
    "bfloat16 sum": (torch.bfloat16, torch.sum),
    "float16 amax": (torch.float16, torch.amax),
}


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict[str, float]:
    """Bytes per second of each of ``BANDWIDTH_PROBES`` over a ``gib`` GiB tensor (best of
    ``repeats``). The memory delivers at least the fastest of them."""
    rates = {}
    for name, (dtype, reduce) in BANDWIDTH_PROBES.items():
        x = torch.ones(int(gib * 2**30) // dtype.itemsize, dtype=dtype)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            reduce(x)
            best = min(best, time.perf_counter() - start)
        rates[name] = x.numel() * dtype.itemsize / best
        del x
    return rates


def weight_bytes_per_token(lm: LoadedModel) -> int:
    """Bytes of the weights a decode step reads (the embedding table is only gathered; a
    tied head, the same tensor, is read whole)."""
    return sum(
        p.numel() * p.element_size()
        for name, p in lm.model.named_parameters(remove_duplicate=False)
        if name != "embed.weight"
    )


def step_ms(lm: LoadedModel, rows: list[int], repeats: int) -> dict[int, float]:
    """Median ms of one step of R new rows after a ``CONTEXT``-token context, per R."""
    model, cfg = lm.model, lm.config
    kv = KVStorage(cfg, CONTEXT + max(rows), lm.device, model.kv_dtype)
    tokens = torch.arange(CONTEXT + max(rows)) % cfg.vocab_size
    context = torch.arange(CONTEXT)
    model.step([SeqStep(tokens[:CONTEXT], context, context, context[:0], logits="none")], kv)

    def run(r: int) -> None:
        new = torch.arange(CONTEXT, CONTEXT + r)
        model.step([SeqStep(tokens[CONTEXT : CONTEXT + r], new, new, context)], kv)

    times: dict[int, list[float]] = {r: [] for r in rows}
    for r in rows:
        run(r)  # warm-up
    for _ in range(repeats):  # round robin: load changes hit every R alike
        for r in rows:
            start = time.perf_counter()
            run(r)
            times[r].append(time.perf_counter() - start)
    return {r: round(statistics.median(t) * 1e3, 2) for r, t in times.items()}


def fused_vs_per_op(lm: LoadedModel, rows: list[int], rounds: int) -> dict[str, Any]:
    """Median wall and process-CPU ms of the step of ``step_ms`` on the fused stack and on
    the per-op path (``DRAFTGATE_FUSED=0``), interleaved in one process (the order
    alternating each round; CPU time counts every thread, spinning ones included)."""
    model, cfg = lm.model, lm.config
    kv = KVStorage(cfg, CONTEXT + max(rows), lm.device, model.kv_dtype)
    tokens = torch.arange(CONTEXT + max(rows)) % cfg.vocab_size
    context = torch.arange(CONTEXT)
    model.step([SeqStep(tokens[:CONTEXT], context, context, context[:0], logits="none")], kv)
    options = model.kernel_options
    paths = {"fused": replace(options, fused=True), "per_op": replace(options, fused=False)}
    wall: dict[str, dict[int, list[float]]] = {p: {r: [] for r in rows} for p in paths}
    cpu: dict[str, dict[int, list[float]]] = {p: {r: [] for r in rows} for p in paths}
    for round_ in range(rounds + 1):  # the first is a warm-up
        for r in rows:
            new = torch.arange(CONTEXT, CONTEXT + r)
            step = SeqStep(tokens[CONTEXT : CONTEXT + r], new, new, context)
            for path in list(paths)[:: 1 if round_ % 2 else -1]:
                model.kernel_options = paths[path]
                start, start_cpu = time.perf_counter(), time.process_time()
                model.step([step], kv)
                if round_:
                    wall[path][r].append(time.perf_counter() - start)
                    cpu[path][r].append(time.process_time() - start_cpu)
    model.kernel_options = options

    def median_ms(times: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
        return {
            p: {r: round(statistics.median(t) * 1e3, 2) for r, t in by_rows.items()}
            for p, by_rows in times.items()
        }

    return {"wall_ms": median_ms(wall), "cpu_ms": median_ms(cpu), "rounds": rounds}


def bf16_kernels_ab(lm: LoadedModel, rows: list[int], rounds: int) -> dict[str, Any]:
    """ms of the step of ``step_ms`` with ``DRAFTGATE_AMX`` 0 (bf16 weights on the float32
    kernels) and 1 (the bf16 kernels), alternating in one process (the weights repacked at
    each switch, outside the timing), per round; and per setting the least disturbed round."""
    times: dict[str, list[dict[int, float]]] = {"0": [], "1": []}
    options = lm.model.kernel_options
    for round_ in range(rounds):
        for setting in ("0", "1")[:: 1 if round_ % 2 == 0 else -1]:
            lm.model.kernel_options = replace(options, amx=setting == "1")
            times[setting].append(step_ms(lm, rows, 3))
    lm.model.kernel_options = options
    best = {s: {r: min(t[r] for t in ts) for r in rows} for s, ts in times.items()}
    return {"rounds": times, "min_ms": best}


class TimedOps:
    """Step kernels that add each call's seconds to ``seconds[kernel]`` (the head's linear
    apart, told by its output width)."""

    def __init__(self, ops: StepOps, vocab: int) -> None:
        self.ops, self.vocab = ops, vocab
        self.name = ops.name
        self.seconds: dict[str, float] = defaultdict(float)

    def __getattr__(self, kernel: str) -> Any:
        function = getattr(self.ops, kernel)

        def timed(*args: Any) -> Any:
            start = time.perf_counter()
            out = function(*args)
            wide = kernel == "linear" and args[1].shape[0] == self.vocab
            self.seconds["head" if wide else kernel] += time.perf_counter() - start
            return out

        return timed


def breakdown(lm: LoadedModel, rows: int, context: int, repeats: int) -> dict[str, float]:
    """ms per step of ``rows`` new rows after ``context`` tokens, by kernel (median over
    ``repeats``), with ``total`` and ``other`` (the rest: Python, embedding, the plan).

    On the fused C++ stack the kernels are timed inside its one call (linear, head,
    attention, row_ops = norms, rotary + K/V store, SwiGLU, residual adds); on the per-op
    path around each call."""
    model, cfg = lm.model, lm.config
    kv = KVStorage(cfg, context + rows, lm.device, model.kv_dtype)
    tokens = torch.arange(context + rows) % cfg.vocab_size
    ctx = torch.arange(context)
    if context:
        model.step([SeqStep(tokens[:context], ctx, ctx, ctx[:0], logits="none")], kv)
    new = torch.arange(context, context + rows)
    step = SeqStep(tokens[context:], new, new, ctx, logits="last")
    stack = model.fused_stack()
    real = local_verifier.model.step_ops
    runs: list[dict[str, float]] = []
    for _ in range(repeats + 1):  # the first is a warm-up
        if stack is not None:
            stack.profile = torch.zeros(len(PROFILE_KINDS), dtype=torch.float64)
            start = time.perf_counter()
            model.step([step], kv)
            total = time.perf_counter() - start
            seconds = dict(zip(PROFILE_KINDS, stack.profile.tolist(), strict=True))
            stack.profile = None
        else:
            timed = TimedOps(real(lm.device, model.dtype), cfg.vocab_size)
            with mock.patch.object(local_verifier.model, "step_ops", return_value=timed):
                start = time.perf_counter()
                model.step([step], kv)
                total = time.perf_counter() - start
            seconds = dict(timed.seconds)
        runs.append({**seconds, "total": total, "other": total - sum(seconds.values())})
    return {k: round(statistics.median(r[k] for r in runs[1:]) * 1e3, 2) for k in runs[-1]}


def prefill(
    lm: LoadedModel, length: int, chunk: int, tokens: torch.Tensor | None = None
) -> dict[str, float]:
    """Tokens/s of processing a ``length``-token prompt (``tokens``, or ids counting up) in
    ``chunk``-row steps, the share of that time in the attention kernel, and the growth of
    the peak RSS (MiB) it caused."""
    cfg = lm.config
    kv = KVStorage(cfg, length, lm.device, lm.model.kv_dtype)
    if tokens is None:
        tokens = torch.arange(length) % cfg.vocab_size
    stack = lm.model.fused_stack()
    timed = TimedOps(local_verifier.model.step_ops(lm.device, lm.model.dtype), cfg.vocab_size)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start, cpu = time.perf_counter(), time.process_time()
    with contextlib.ExitStack() as timing:
        if stack is not None:  # timed inside the fused call
            stack.profile = torch.zeros(len(PROFILE_KINDS), dtype=torch.float64)
        else:  # around each per-op call
            timing.enter_context(
                mock.patch.object(local_verifier.model, "step_ops", return_value=timed)
            )
        for begin in range(0, length, chunk):
            new = torch.arange(begin, min(begin + chunk, length))
            step = SeqStep(tokens[new], new, new, torch.arange(begin), logits="last")
            lm.model.step([step], kv)
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    if stack is not None:
        timed.seconds.update(zip(PROFILE_KINDS, stack.profile.tolist(), strict=True))
        stack.profile = None
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    return {
        "tokens": length,
        "seconds": round(seconds, 2),
        "tok_s": round(length / seconds, 1),
        "tok_per_cpu_s": round(length / cpu_s, 1),
        "attention_share": round(timed.seconds["attention"] / seconds, 3),
        "peak_rss_growth_mib": round(grown / 1024, 1),
    }


def run_ours(lm: LoadedModel, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    """(token ids, prefill seconds, decode seconds)."""
    *_, result = generate_plain(lm, prompt, SamplingParams(), max_tokens=n)
    assert isinstance(result, PlainResult)
    return result.token_ids, result.prefill_s, result.decode_s


def run_hf(
    peer: TransformersPeer, prompt: list[int], n: int, eos: list[int]
) -> tuple[list[int], float, float]:
    """(token ids, prefill seconds, decode seconds) with transformers ``generate``, in its
    own process."""
    kwargs = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    out, total, prefill_s = peer.generate_timed(prompt, max_new_tokens=n, **kwargs)
    tokens = [t for t in out if t not in eos]
    return tokens, prefill_s, total - prefill_s


def compare_with_transformers(
    lm: LoadedModel, rows: list[WorkloadItem], max_tokens: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-prompt entries and the summary of ours vs transformers (in a process of its
    own), greedy."""
    eos = sorted(lm.tokenizer.eos_ids)
    tok = lm.tokenizer
    prompts = [tok.encode(tok.apply_chat_template(r.messages)) for r in rows]
    warm = prompts[0][:32]
    run_ours(lm, warm, 4)
    # on the AMX kernels (weights in their layout after a step) linear inputs round to bf16;
    # on a CPU with them, bf16 K/V's queries too
    library, _ = load_library()
    dot_scores = lm.dtype == torch.bfloat16 and lm.device.type == "cpu"
    dot_scores = dot_scores and library is not None and library.dg_bf16_kernels() != 0
    amx = layout_of(lm.model.head.weight) == "amx"
    with TransformersPeer(lm.name, lm.dtype, amx, dot_scores) as hf:
        run_hf(hf, warm, 4, eos)
        every = []
        for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
            n = min(max_tokens, row.max_tokens)
            sides = {}
            for side in ("ours", "hf") if i % 2 == 0 else ("hf", "ours"):
                sides[side] = (
                    run_ours(lm, prompt, n) if side == "ours" else run_hf(hf, prompt, n, eos)
                )
            every.append(sides)
    results = []
    for row, prompt, runs in zip(rows, prompts, every, strict=True):
        entry = {
            "id": row.id,
            "category": row.category,
            "prompt_tokens": len(prompt),
            "tokens": {s: len(runs[s][0]) for s in runs},
            "prefill_s": {s: round(runs[s][1], 4) for s in runs},
            "decode_s": {s: round(runs[s][2], 4) for s in runs},
            "tps": {s: round(max(len(runs[s][0]) - 1, 0) / runs[s][2], 2) for s in runs},
            "identical": runs["ours"][0] == runs["hf"][0],
        }
        results.append(entry)
        print(
            f"{entry['id']:>10} {entry['category']:>12} prompt={len(prompt):5d} "
            f"tok/s ours={entry['tps']['ours']:.1f} hf={entry['tps']['hf']:.1f} "
            f"identical={entry['identical']}",
            flush=True,
        )

    def rate(side: str) -> float:
        tokens = sum(max(r["tokens"][side] - 1, 0) for r in results)
        return tokens / sum(r["decode_s"][side] for r in results)

    summary = {
        "decode_tps": {"ours": round(rate("ours"), 2), "hf": round(rate("hf"), 2)},
        "decode_ratio": round(rate("ours") / rate("hf"), 3),
        "prefill_ratio_median": round(
            statistics.median(r["prefill_s"]["hf"] / r["prefill_s"]["ours"] for r in results), 3
        ),
        "identical": sum(r["identical"] for r in results),
        "prompts_run": len(results),
    }
    return results, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", type=Path, default=None, help="JSONL (default: shipped)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--dtype",
        default=None,
        help="float32 or bf16 (default: the machine's, see devices.default_dtype)",
    )
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    parser.add_argument("--category", action="append", default=[], help="only these categories")
    parser.add_argument("--rows", default="1,4,16,64", help="rows per timed step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", default="1024,4096,8192", help="prompt lengths ('' = none)")
    parser.add_argument("--chunk", type=int, default=512, help="rows per prompt-processing step")
    parser.add_argument(
        "--ab", type=int, default=0, help="rounds of fused stack vs per-op path (0 = none)"
    )
    parser.add_argument(
        "--ab-bf16", type=int, default=0, help="rounds of DRAFTGATE_AMX=0 vs 1 (0 = none)"
    )
    parser.add_argument(
        "--bandwidth-gib", type=float, default=1.0, help="GiB read by each bandwidth probe"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: measured and chosen at load)"
    )
    args = parse(parser, SMOKE)

    lm = load_model(args.model, args.device, args.dtype, tune_threads=not args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict[str, Any] = {
        "model": lm.name,
        "device": str(lm.device),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "step_path": "fused" if lm.model.fused_stack() is not None else "per-op",
    }
    rows_per_step = [int(r) for r in args.rows.split(",") if r]
    steps = step_ms(lm, rows_per_step, args.repeats)
    report["step_ms"] = steps
    print(f"ms per step by rows: {steps}", flush=True)
    if args.ab and lm.model.fused_stack() is not None:
        report["step_ms_ab"] = fused_vs_per_op(lm, rows_per_step, args.ab)
        print(f"ms per step, fused vs per-op interleaved: {report['step_ms_ab']}", flush=True)
    if args.ab_bf16:
        report["step_ms_ab_bf16"] = bf16_kernels_ab(lm, rows_per_step, args.ab_bf16)
        print(f"ms per step, AMX=0 vs 1: {report['step_ms_ab_bf16']['min_ms']}", flush=True)
    report["breakdown_ms"] = {
        "decode_1_row": breakdown(lm, 1, CONTEXT, args.repeats),
        f"prompt_chunk_{args.chunk}_rows": breakdown(lm, args.chunk, 0, max(args.repeats // 2, 1)),
    }
    for what, parts in report["breakdown_ms"].items():
        print(f"{what}: {parts}", flush=True)
    # before the bandwidth probe: its 1 GiB buffer would mask the peak RSS growth
    lengths = [int(n) for n in args.prefill.split(",") if n]
    report["prefill"] = [prefill(lm, n, args.chunk) for n in lengths if n <= lm.context_length]
    for entry in report["prefill"]:
        print(f"prefill {entry}", flush=True)
    if lm.device.type == "cpu":
        probes = read_bandwidth(args.bandwidth_gib)
        bandwidth = max(probes.values())
        floor_ms = weight_bytes_per_token(lm) / bandwidth * 1e3
        report["bandwidth_gb_s"] = round(bandwidth / 1e9, 2)
        report["bandwidth_probes_gb_s"] = {k: round(v / 1e9, 2) for k, v in probes.items()}
        report["floor_ms"] = round(floor_ms, 2)
        if 1 in steps:
            report["floor_fraction"] = round(floor_ms / steps[1], 3)
        print(
            f"bandwidth {bandwidth / 1e9:.1f} GB/s {report['bandwidth_probes_gb_s']}, "
            f"floor {floor_ms:.2f} ms",
            flush=True,
        )

    rows = workload(args.workload, args.category)
    if args.limit:
        rows = rows[: args.limit]
    prompts, summary = compare_with_transformers(lm, rows, args.max_tokens)
    report["summary"] = summary
    write_json(args.json, {**report, "prompts": prompts})
    print(json.dumps({k: v for k, v in report.items() if k != "prefill"}))


if __name__ == "__main__":
    main()
