"""Serving modeled offline: scheduling and draft sizing compared without a clock.

    python benchmarks/sim_serving.py record --workload benchmarks/workloads/default.jsonl \
        --max-tokens 128 [--sampling seeded] --out benchmarks/workloads/default-answers-128.json
    python benchmarks/sim_serving.py run --answers benchmarks/workloads/default-answers-128.json \
        --concurrency 1,4,8 [--limit 8] [--step-ms 1:34.7,4:41.1,16:78.5,64:221.2] \
        [--seq-overhead-ms 0]

``record`` runs the real SmolLM2 once (greedy, or ``bench_serving.py``'s seeded sampling;
the workload's chat messages as ``bench_serving.py`` sends them) and stores every prompt's
and answer's token ids. A seeded answer replays exactly: sampling draws one value per
emitted token, so a draft token is accepted exactly when it equals the recorded one.
``run`` replays them through the engine's real scheduler, drafters and draft sizing
(``local_verifier.replay``), each forward step costing the measured time of its row count
(default: the idle 2-core machine's 1/4/16/64-row figures in RESULTS.md), closed loop at
each concurrency with drafts off and on. ``--limit N`` keeps N answers taken from the
categories in turn, as ``bench_serving.py --limit`` does. The figures are deterministic:
rows, steps and modeled tokens/s, TTFT and e2e, plus the scheduler's own CPU time per
step (measured, an indication), then issue 12's goal ratios. JSON with ``--json``.

``--startup-ms`` gives the scheduler another start-up table than the modeled costs (a
start-up measured under other load): it learns the modeled ones from the steps it runs.
``--host-time`` adds the scheduler's own measured CPU time per step to the modeled clock
(drafting, verification, output; not deterministic). ``--seq-overhead-ms`` adds host time
per sequence per step (outside the forward, beyond the scheduler's): 12 ms
reproduces the idle machine's HTTP figures without drafts (the audit workload,
``benchmarks/workloads/audit-answers-64.json``: 20.6 / 40.8 / 44.2 modeled tokens/s at
concurrency 1 / 4 / 8 against 16.9 / 44.6 / 48.6 measured).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_serving import select_items  # noqa: E402
from local_verifier.replay import Answer, StepCostTable, replay  # noqa: E402
from local_verifier.tokenizer import Tokenizer  # noqa: E402

SAMPLINGS = {"greedy": {"temperature": 0}, "seeded": {"temperature": 0.8, "seed": 1234}}
"""bench_serving.py's samplings (a seeded answer replays exactly: one draw per emitted token)."""
IDLE_STEP_MS = "1:34.7,4:41.1,16:78.5,64:221.2"


def _tokenizer() -> Tokenizer:
    from gguf import GGUFReader

    from local_verifier.gguf_loader import read_tokenizer
    from local_verifier.loader import smollm2_path

    return read_tokenizer(GGUFReader(str(smollm2_path())))


def record(args: argparse.Namespace) -> None:
    from local_verifier.engine import END, Engine, GenerationRequest, TextDelta
    from local_verifier.sampling import SamplingParams

    lines = Path(args.workload).read_text().splitlines()
    items = select_items([json.loads(line) for line in lines if line], args.categories, args.limit)
    # the answers do not depend on the step costs (greedy, bitwise batch invariant)
    engine = Engine("smollm2-135m", row_costs=[0.03 + 0.002 * r for r in range(128 + 64 + 1)])
    params = SamplingParams(**SAMPLINGS[args.sampling])
    answers: list[dict[str, Any]] = []
    finished = threading.Semaphore(0)
    for item in items:
        req = GenerationRequest(
            messages=item["messages"],
            params=params,
            max_tokens=args.max_tokens,
        )
        answer = {"id": item["id"], "category": item["category"], "output_ids": []}
        answer["prompt_ids"] = engine.tokenizer.encode(
            engine.tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True)
        )
        answers.append(answer)

        def on_item(x: Any, answer: dict[str, Any] = answer) -> None:
            if isinstance(x, TextDelta):
                answer["output_ids"] += x.token_ids
            elif isinstance(x, Exception):
                raise x
            elif x is END:
                finished.release()

        engine.submit(req, on_item)
    for _ in items:
        finished.acquire()
    out = {"model": "smollm2-135m", "sampling": args.sampling, "max_tokens": args.max_tokens}
    Path(args.out).write_text(json.dumps(out | {"answers": answers}) + "\n")


def run(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.answers).read_text())
    picked = select_items(data["answers"], args.categories, args.limit)
    answers = [
        Answer(a["id"], a["prompt_ids"], a["output_ids"], data["max_tokens"]) for a in picked
    ]
    costs = _table(args.step_ms)
    startup = _table(args.startup_ms) if args.startup_ms else None
    tokenizer = _tokenizer()
    torch.set_num_threads(1)
    rows = []
    for concurrency in sorted({int(c) for c in args.concurrency.split(",")}):
        for drafts in (False, True):
            result = replay(
                answers,
                tokenizer,
                costs,
                concurrency=concurrency,
                drafts=drafts,
                token_budget=args.token_budget,
                seq_overhead_s=args.seq_overhead_ms / 1000,
                client_s=args.client_ms / 1000,
                warm=not args.cold,
                host_time=args.host_time,
                startup=startup,
            )
            row = result.summary()
            print(json.dumps(row), flush=True)
            rows.append(row)
    goals = goal_ratios(rows)
    print(json.dumps({"goals": goals}), flush=True)
    if args.json:
        out = {"step_ms": args.step_ms, "sampling": data["sampling"], "levels": rows}
        Path(args.json).write_text(json.dumps(out | {"goals": goals}, indent=2))


def _table(step_ms: str) -> StepCostTable:
    points = dict(p.split(":") for p in step_ms.split(","))
    return StepCostTable({int(r): float(ms) / 1000 for r, ms in points.items()})


def goal_ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Issue 12's ratios: drafts over none per level, c8 / c1 tokens/s and c4 / c1 e2e p50
    with drafts (where those levels ran)."""
    cell = {(r["concurrency"], r["drafts"]): r for r in rows}
    out = {
        f"drafts_gain_c{c}": round(r["output_tok_s"] / cell[c, False]["output_tok_s"], 3)
        for (c, drafts), r in cell.items()
        if drafts and (c, False) in cell
    }
    if (1, True) in cell and (8, True) in cell:
        out["c8_over_c1_tok_s"] = round(
            cell[8, True]["output_tok_s"] / cell[1, True]["output_tok_s"], 3
        )
    if (1, True) in cell and (4, True) in cell:
        out["c4_over_c1_e2e_p50"] = round(
            cell[4, True]["e2e_ms"]["p50"] / cell[1, True]["e2e_ms"]["p50"], 3
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="store answers from the real model")
    rec.add_argument("--workload", default="benchmarks/workloads/default.jsonl")
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--out", required=True)
    rec.add_argument("--sampling", choices=SAMPLINGS, default="greedy", help="as bench_serving")
    sim = sub.add_parser("run", help="replay stored answers through the scheduler")
    sim.add_argument("--answers", required=True)
    sim.add_argument("--concurrency", default="1,4,8")
    sim.add_argument("--step-ms", default=IDLE_STEP_MS, help="rows:ms,... measured step costs")
    sim.add_argument(
        "--startup-ms", help="rows:ms,... the scheduler starts from (default --step-ms)"
    )
    sim.add_argument("--seq-overhead-ms", type=float, default=0.0, help="host ms per sequence")
    sim.add_argument("--token-budget", type=int, default=128, help="prompt rows per step")
    sim.add_argument("--client-ms", type=float, default=2.0, help="client's gap between requests")
    sim.add_argument("--cold", action="store_true", help="prompts not in the prefix cache")
    sim.add_argument(
        "--host-time", action="store_true", help="the scheduler's measured CPU time counts too"
    )
    sim.add_argument("--json")
    for p in (rec, sim):
        p.add_argument("--categories", help="comma-separated workload categories")
        p.add_argument("--limit", type=int, help="at most N requests, categories in turn")
    args = parser.parse_args()
    record(args) if args.command == "record" else run(args)


if __name__ == "__main__":
    main()
