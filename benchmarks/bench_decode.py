"""Plain greedy decoding: our engine vs transformers ``generate`` on the same model and prompts.

    python benchmarks/bench_decode.py --max-tokens 64 --json /tmp/bench_decode.json \
        [--workload PATH] [--limit 4] [--model smollm2-135m]

Both run interleaved per prompt (order alternating) in one process after a warm-up, greedy,
stopping on EOS or after N tokens. Per prompt: prefill seconds and decode tokens/s of each
(decode = tokens after the first / time after the first token), and whether the token ids
are identical. The summary gives ours/transformers ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from local_verifier.generate import PlainResult, generate_plain
from local_verifier.loader import LoadedModel, load_model
from local_verifier.reference import load_reference
from local_verifier.sampling import SamplingParams

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "default.jsonl"
"""The workload this project ships (``benchmarks/workloads/build.py`` makes it)."""


def run_ours(lm: LoadedModel, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    """(token ids, prefill seconds, decode seconds)."""
    *_, result = generate_plain(lm, prompt, SamplingParams(), max_tokens=n)
    assert isinstance(result, PlainResult)
    return result.token_ids, result.prefill_s, result.decode_s


def run_hf(model: Any, prompt: list[int], n: int, eos: list[int]) -> tuple[list[int], float, float]:
    """(token ids, prefill seconds, decode seconds) with transformers ``generate``."""
    ids = torch.tensor([prompt])
    kwargs = dict(do_sample=False, eos_token_id=eos, pad_token_id=eos[0])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, **kwargs)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, **kwargs)
        total = time.perf_counter() - start
    tokens = [t for t in out[0, len(prompt) :].tolist() if t not in eos]
    return tokens, prefill, max(total - prefill, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", type=Path, default=WORKLOAD, help="JSONL workload file")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--limit", type=int, default=0, help="first N prompts only (0 = all)")
    parser.add_argument("--category", action="append", default=[], help="only these categories")
    args = parser.parse_args()

    rows = [json.loads(x) for x in args.workload.read_text().splitlines() if x.strip()]
    if args.category:
        rows = [r for r in rows if r["category"] in args.category]
    if args.limit:
        rows = rows[: args.limit]
    lm = load_model(args.model, dtype=args.dtype)
    hf = load_reference(args.model)
    eos = sorted(lm.tokenizer.eos_ids)
    tok = lm.tokenizer
    prompts = [tok.encode(tok.apply_chat_template(r["messages"])) for r in rows]

    warm = prompts[0][:32]
    run_ours(lm, warm, 4)
    run_hf(hf, warm, 4, eos)

    results = []
    for i, (row, prompt) in enumerate(zip(rows, prompts, strict=True)):
        n = min(args.max_tokens, row.get("max_tokens") or args.max_tokens)
        runs = {}
        for side in ("ours", "hf") if i % 2 == 0 else ("hf", "ours"):
            if side == "ours":
                runs[side] = run_ours(lm, prompt, n)
            else:
                runs[side] = run_hf(hf, prompt, n, eos)
        entry = {
            "id": row["id"],
            "category": row["category"],
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
            f"prefill ours={entry['prefill_s']['ours']:.3f}s hf={entry['prefill_s']['hf']:.3f}s  "
            f"tok/s ours={entry['tps']['ours']:.1f} hf={entry['tps']['hf']:.1f}  "
            f"identical={entry['identical']}",
            flush=True,
        )

    def rate(side: str) -> float:
        tokens = sum(max(r["tokens"][side] - 1, 0) for r in results)
        return tokens / sum(r["decode_s"][side] for r in results)

    summary = {
        "model": lm.name,
        "device": str(lm.device),
        "dtype": str(lm.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "max_tokens": args.max_tokens,
        "decode_tps": {"ours": round(rate("ours"), 2), "hf": round(rate("hf"), 2)},
        "decode_ratio": round(rate("ours") / rate("hf"), 3),
        "prefill_ratio_median": round(
            statistics.median(r["prefill_s"]["hf"] / r["prefill_s"]["ours"] for r in results), 3
        ),
        "identical": sum(r["identical"] for r in results),
        "prompts_run": len(results),
    }
    args.json.write_text(json.dumps({"summary": summary, "prompts": results}, indent=2))
    print(
        f"decode tok/s ours={summary['decode_tps']['ours']} hf={summary['decode_tps']['hf']} "
        f"ratio ours/hf={summary['decode_ratio']}x; prefill speed ratio (hf_s/ours_s, median)="
        f"{summary['prefill_ratio_median']}x; identical {summary['identical']}/{len(results)}"
    )


if __name__ == "__main__":
    main()
