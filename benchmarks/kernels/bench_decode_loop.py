"""Where a plain decode token's time goes: the real decode loop against its forward step.

    python -m benchmarks.kernels.bench_decode_loop [--workload WORKLOAD.jsonl] [--category code_edit] \
        [--limit 2] [--max-tokens 64] [--long 1024] [--contexts 128,1024] [--repeats 5] \
        [--threads N] --json OUT

In one process:
- per prompt (the workload's, then a synthetic ``--long``-token one): ``generate_plain``,
  greedy, with each part of a token timed inside the loop: the fused C++ call split by
  kernel (linear layers, head, attention, row-wise ops), the rest of ``Transformer.step``
  (Python: plan, embedding, checks), the batch-1 ``forward`` wrapper around it, the output
  assembler (detokenisation, stop strings) and the rest of the loop (argmax, the token's
  tensor); ms per token, wall and process CPU;
- a 1-row step after each of ``--contexts`` tokens (``bench_decode.breakdown``: the
  bench's step is after 128), to tell the context's share from the loop's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from benchmarks.bench_decode import breakdown
from benchmarks.harness import workload
from local_verifier.kernels.fused import PROFILE_KINDS, FusedStack
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import Transformer
from local_verifier.output import OutputAssembler
from local_verifier.sampling import SamplingParams
from local_verifier.testing import generate
from local_verifier.testing.generate import PlainResult, generate_plain


@contextmanager
def timed(owner: Any, name: str, seconds: dict[str, float], key: str) -> Iterator[None]:
    """``owner.name`` adds each call's wall seconds to ``seconds[key]`` while inside."""
    function: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    with mock.patch.object(owner, name, wrapper):
        yield


def decode_parts(lm: LoadedModel, prompt: list[int], n: int) -> dict[str, Any]:
    """ms per decode token of ``generate_plain`` on ``prompt``, by part (see the module)."""
    stack = lm.model.fused_stack()
    if stack is None:
        raise SystemExit("needs the fused C++ stack (the C++ backend, DRAFTGATE_FUSED unset)")
    seconds: dict[str, float] = defaultdict(float)
    profile = torch.zeros(len(PROFILE_KINDS), dtype=torch.float64)
    with (
        timed(FusedStack, "run", seconds, "cpp_call"),
        timed(Transformer, "step", seconds, "step"),
        timed(generate, "forward", seconds, "forward"),
        timed(OutputAssembler, "push", seconds, "assembler"),
    ):
        items = generate_plain(lm, prompt, SamplingParams(), max_tokens=n)
        first = next(items)  # the prefill and the first token's push
        stack.profile = profile
        start, cpu = time.perf_counter(), time.process_time()
        baseline = dict(seconds)
        *_, result = items
        wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        stack.profile = None
    assert isinstance(result, PlainResult) and first is not None
    tokens = len(result.token_ids) - 1  # decode steps after the prefill's token
    part = {k: seconds[k] - baseline.get(k, 0.0) for k in seconds}
    kernels = dict(zip(PROFILE_KINDS, profile.tolist(), strict=True))
    ms = {
        **{k: kernels[k] for k in PROFILE_KINDS},
        "cpp_other": part["cpp_call"] - sum(kernels.values()),
        "step_python": part["step"] - part["cpp_call"],
        "forward_wrapper": part["forward"] - part["step"],
        "assembler": part["assembler"],
        "loop_rest": wall - part["forward"] - part["assembler"],
        "total": wall,
        "total_cpu": cpu_s,
    }
    return {
        "prompt_tokens": len(prompt),
        "decode_tokens": tokens,
        "mean_context": len(prompt) + tokens / 2,
        "ms_per_token": {k: round(v / tokens * 1e3, 3) for k, v in ms.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", type=Path, default=None, help="default: the shipped one")
    parser.add_argument("--category", action="append", default=[])
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--long", type=int, default=1024, help="synthetic prompt (0 = none)")
    parser.add_argument("--contexts", default="128,1024", help="1-row steps after these")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="0 = the loader's choice")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()

    lm = load_model("smollm2-135m", tune_threads=not args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = workload(args.workload, args.category)
    tok = lm.tokenizer
    prompts = {
        r.id: tok.encode(tok.apply_chat_template(r.messages)) for r in rows[: args.limit or None]
    }
    if args.long:  # token ids of ordinary text, cut to length
        text = " ".join(json.dumps(r["messages"]) for r in rows)
        prompts[f"long-{args.long}"] = tok.encode(text * (1 + args.long * 8 // len(text)))[
            : args.long
        ]
    report: dict[str, Any] = {"model": lm.name, "threads": torch.get_num_threads(), "loops": {}}
    decode_parts(lm, next(iter(prompts.values()))[:32], 4)  # warm-up
    for name, prompt in prompts.items():
        entry = decode_parts(lm, prompt, args.max_tokens)
        report["loops"][name] = entry
        print(f"{name}: {json.dumps(entry)}", flush=True)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    report["steps"] = {c: breakdown(lm, 1, c, args.repeats) for c in contexts}
    for c, parts in report["steps"].items():
        print(f"1-row step after {c}: {parts}", flush=True)
    loops = list(report["loops"].values())
    report["summary_ms_per_token"] = {
        k: round(statistics.mean(e["ms_per_token"][k] for e in loops), 3)
        for k in loops[0]["ms_per_token"]
    }
    args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
