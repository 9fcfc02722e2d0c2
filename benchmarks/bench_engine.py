"""The serving engine without HTTP: batch invariance, identity and throughput by concurrency.

    python -m benchmarks.bench_engine --device cuda --dtypes float32,bfloat16 --json OUT
        [--random-like DIR] [--max-tokens 64] [--concurrency 1,4,8] [--prompts 8] [--smoke]

For each dtype: (1) a prompt's last-row logits alone equal (``torch.equal``) the same row
batched with the other prompts in one ``Transformer.step``, and when the prompt is
prefilled in chunks of 1, 7 and 64; (2) every prompt's answer with drafts, all submitted
at once, equals its answer alone without drafts (greedy and seeded sampling); (3) output
tokens/s in closed loop at each ``--concurrency`` (1, 4 and 8), drafts off and on.

``--random-like DIR`` builds a model of the shape in ``DIR/meta.json`` with random weights
and ``DIR/tokenizer.json`` (for machines without the SmolLM2 package: write DIR here with
``--export-shape DIR``, then carry it); otherwise the embedded default is loaded. Random weights change nothing about (1) and (2) and little
about speed.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import parse, write_json
from local_verifier.engine import END, Engine, GenerationRequest, TextDelta
from local_verifier.kv_pool import BlockTable, KVPool
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import ModelConfig, SeqStep, Transformer
from local_verifier.sampling import SamplingParams
from local_verifier.tokenizer import Tokenizer

SMOKE = ("--max-tokens", "4", "--concurrency", "1,3", "--prompts", "3", "--threads", "1")
PROMPTS = [
    "def area(width, height):\n    return width * height\n\n# rename area to rect_area\n",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "Write a haiku about the sea.",
    "import os\nimport sys\n\n" + "x = compute(x)\n" * 20,
    "Explain what a hash map is, in two sentences.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,",
    "SELECT name FROM users WHERE id = 1;\n" * 4,
    "Once upon a time",
]


def random_like(directory: Path, device: str, dtype: torch.dtype) -> LoadedModel:
    from tokenizers import Tokenizer as Backend

    meta = json.loads((directory / "meta.json").read_text())
    cfg = ModelConfig(**meta["config"])
    tokenizer = Tokenizer(
        Backend.from_file(str(directory / "tokenizer.json")),
        eos_ids=set(meta["eos_ids"]),
        bos_id=meta["bos_id"],
        chat_template=meta["chat_template"],
        special_tokens=meta["special_tokens"],
        add_bos=meta["add_bos"],
    )
    model = Transformer.from_config(cfg, device=device, dtype=dtype)
    return LoadedModel(model, cfg, tokenizer, torch.device(device), dtype, "random-smollm2-shape")


def export_shape(directory: Path) -> None:
    """Write the embedded default's shape and tokenizer (no weights) for ``--random-like``."""
    import dataclasses

    lm = load_model("smollm2-135m", "cpu", "float32")
    tok = lm.tokenizer
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(tok.backend.to_str())
    meta = {
        "config": dataclasses.asdict(lm.config),
        "eos_ids": sorted(tok.eos_ids),
        "bos_id": tok.bos_id,
        "chat_template": tok.chat_template,
        "special_tokens": tok.special_tokens,
        "add_bos": tok.add_bos,
    }
    (directory / "meta.json").write_text(json.dumps(meta))


def invariance(lm: LoadedModel, prompts: list[list[int]]) -> dict[str, bool]:
    """Last-row logits alone == batched with the others == prefilled in chunks."""
    model = lm.model
    pool = KVPool(KVStorage(lm.config, 64 * 16 * 20, lm.device, lm.model.kv_dtype), 16)

    def prefill(ids: list[int], table: BlockTable, start: int, end: int) -> SeqStep:
        return SeqStep(
            tokens=torch.tensor(ids[start:end]),
            positions=torch.arange(start, end),
            new_slots=table.slots(start, end),
            context_slots=table.slots(0, start),
            logits="last",
        )

    tables = []
    for ids in prompts:
        table = BlockTable(pool)
        table.reserve(len(ids))
        tables.append(table)
    alone = [
        model.step([prefill(p, t, 0, len(p))], pool.storage)[0]
        for p, t in zip(prompts, tables, strict=True)
    ]
    batched = model.step(
        [prefill(p, t, 0, len(p)) for p, t in zip(prompts, tables, strict=True)], pool.storage
    )
    out = {"batched_eq_alone": all(torch.equal(a, b) for a, b in zip(alone, batched, strict=True))}
    for chunk in (1, 7, 64):
        same = True
        for ids, table, want in zip(prompts, tables, alone, strict=True):
            logits = None
            for start in range(0, len(ids), chunk):
                end = min(start + chunk, len(ids))
                logits = model.step([prefill(ids, table, start, end)], pool.storage)[0]
            same = same and logits is not None and torch.equal(logits, want)
        out[f"chunks_of_{chunk}_eq_whole"] = same
    return out


def _collect(engine: Engine, reqs: list[GenerationRequest]) -> list[list[int]]:
    outs: list[list[int]] = [[] for _ in reqs]

    def sink(i: int) -> Any:
        def push(item: Any) -> None:
            if isinstance(item, TextDelta):
                outs[i].extend(item.token_ids)

        return push

    for i, req in enumerate(reqs):
        engine.submit(req, sink(i))
    assert engine.wait_idle(600)
    return outs


def identity(engine: Engine, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
    out = {}
    for name, params in (("greedy", SamplingParams()), ("seeded", SamplingParams(0.8, seed=9))):
        alone = [
            _collect(
                engine,
                [
                    GenerationRequest(
                        prompt_ids=p, params=params, max_tokens=max_tokens, draft=False
                    )
                ],
            )[0]
            for p in prompts
        ]
        together = _collect(
            engine,
            [
                GenerationRequest(prompt_ids=p, params=params, max_tokens=max_tokens)
                for p in prompts
            ],
        )
        out[name] = sum(a == b for a, b in zip(alone, together, strict=True)) / len(prompts)
    return out


def throughput(
    engine: Engine, prompts: list[list[int]], max_tokens: int, concurrency: int, drafts: bool
) -> float:
    """Output tokens/s, closed loop: ``concurrency`` workers, every prompt once, in order,
    as ``bench_serving.py`` sends them over HTTP (each prompt sent twice in a row gave
    1.13-1.15x the tokens/s at concurrency 4 and 8, which HTTP clients do not get)."""
    todo = list(prompts)
    lock = threading.Lock()
    tokens = 0
    done = threading.Event()
    running = 0

    def start_next() -> None:
        nonlocal running
        with lock:
            if not todo:
                if running == 0:
                    done.set()
                return
            prompt = todo.pop(0)
            running += 1
        engine.submit(
            GenerationRequest(prompt_ids=prompt, max_tokens=max_tokens, draft=drafts), on_item
        )

    def on_item(item: Any) -> None:
        nonlocal tokens, running
        if isinstance(item, TextDelta):
            tokens += len(item.token_ids)
        elif item is END:
            with lock:
                running -= 1
            start_next()

    began = time.perf_counter()
    for _ in range(concurrency):
        start_next()
    done.wait(600)
    assert engine.wait_idle(600)
    return tokens / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--random-like", type=Path)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--export-shape", type=Path, help="write DIR for --random-like and exit")
    parser.add_argument("--concurrency", default="1,4,8", help="comma-separated levels")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    parser.add_argument("--json")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: measured and chosen at load)"
    )
    args = parse(parser, SMOKE)
    if args.export_shape:
        export_shape(args.export_shape)
        return
    if not args.json:
        parser.error("--json is required")
    levels = [int(c) for c in args.concurrency.split(",")]
    results = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        if args.random_like:
            lm = random_like(args.random_like, args.device, dtype)
        else:
            lm = load_model("smollm2-135m", args.device, dtype_name, tune_threads=not args.threads)
            if args.threads:
                torch.set_num_threads(args.threads)
        prompts = [lm.tokenizer.encode(p) for p in PROMPTS[: args.prompts]]
        began = time.perf_counter()
        engine = Engine(lm, max_draft=32)
        row = {
            "dtype": dtype_name,
            "device": args.device,
            "startup_s": round(time.perf_counter() - began, 1),
        }
        row["invariance"] = invariance(lm, prompts)
        row["identical"] = identity(engine, prompts, args.max_tokens)
        row["output_tok_s"] = {
            f"c{c}_{'drafts' if d else 'plain'}": round(
                throughput(engine, prompts, args.max_tokens, c, d), 1
            )
            for c in levels
            for d in (False, True)
        }
        print(json.dumps(row), flush=True)
        results.append(row)
    write_json(args.json, {"runs": results})


if __name__ == "__main__":
    main()
