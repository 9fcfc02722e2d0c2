"""The engine's plain decoding while another process computes on the same cores.

    python -m benchmarks.bench_contention --json OUT [--tokens 160] [--runs 5] [--smoke]

One request at a time (a 100-token prompt of random ids, greedy, drafts off, nothing
cached), ``--runs`` times each: on the quiet machine, then beside a process running a
torch matrix product in a loop on every core (a peer in its own process, as a second
model server or a test run would be), then quiet again. Reported per run: tokens/s, the
median time between tokens (one step each) and the stalls, steps over 20x the quiet
median. A multi-thread step can stall at each parallel region's barrier while the other
process holds a core; the engine's thread choice (``local_verifier.devices.ThreadTuner``)
is what this measures.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import parse, write_json
from local_verifier.engine import Engine, GenerationRequest, TextDelta
from local_verifier.loader import load_model

SMOKE = ("--tokens", "8", "--runs", "1")
PROMPT_TOKENS = 100
STALL = 20.0  # a step over this many times the quiet median
COMPETITOR = (
    "import torch\n"
    "a, b = torch.randn(64, 1024), torch.randn(1024, 1024)\n"
    "while True:\n"
    "    (a @ b).sum()\n"
)


def one_run(engine: Engine, prompt: list[int], tokens: int) -> list[float]:
    """The seconds from the request to each token."""
    begin = time.perf_counter()
    times = []
    request = GenerationRequest(prompt_ids=prompt, max_tokens=tokens, draft=False)
    for item in engine.generate(request):
        if isinstance(item, TextDelta) and item.token_ids:
            times.append(time.perf_counter() - begin)
    return times


def summary(times: list[float], quiet_step: float | None) -> dict[str, Any]:
    steps = [b - a for a, b in zip(times, times[1:], strict=False)]
    median = statistics.median(steps) if steps else 0.0
    limit = STALL * (quiet_step or median)
    return {
        "tokens": len(times),
        "tok_s": round(len(times) / times[-1], 1),
        "median_step_ms": round(1000 * median, 2),
        "max_step_ms": round(1000 * max(steps, default=0.0), 1),
        "stalls": sum(s > limit for s in steps),
    }


@contextmanager
def competitor() -> Iterator[None]:
    """A process computing on every core until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", COMPETITOR])
    try:
        time.sleep(1.0)  # its threads are up and busy
        yield
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=160, help="per request")
    parser.add_argument("--runs", type=int, default=5, help="requests per phase")
    args = parse(parser, SMOKE)

    lm = load_model(args.model, tune_threads=True)
    engine = Engine(lm, prefix_cache=False)
    rng = random.Random(0)
    prompt = [rng.randrange(100, lm.config.vocab_size) for _ in range(PROMPT_TOKENS)]
    one_run(engine, prompt, 8)  # untimed: the first request's own start-up

    phases: dict[str, list[dict[str, Any]]] = {}
    quiet = [one_run(engine, prompt, args.tokens) for _ in range(args.runs)]
    steps = [b - a for t in quiet for a, b in zip(t, t[1:], strict=False)]
    quiet_step = statistics.median(steps) if steps else None
    phases["quiet"] = [summary(t, quiet_step) for t in quiet]
    with competitor():
        phases["beside_competitor"] = [
            summary(one_run(engine, prompt, args.tokens), quiet_step) for _ in range(args.runs)
        ]
    phases["quiet_again"] = [
        summary(one_run(engine, prompt, args.tokens), quiet_step) for _ in range(args.runs)
    ]
    engine.close()

    def total(phase: str) -> float:
        runs = phases[phase]
        seconds = sum(float(r["tokens"]) / float(r["tok_s"]) for r in runs)
        return round(sum(int(r["tokens"]) for r in runs) / seconds, 1)

    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "phases": phases,
        "tok_s": {phase: total(phase) for phase in phases},
        "stalls": {phase: sum(r["stalls"] for r in phases[phase]) for phase in phases},
    }
    write_json(args.json, result)
    print({k: result[k] for k in ("tok_s", "stalls")})


if __name__ == "__main__":
    main()
