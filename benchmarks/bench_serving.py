"""Serving throughput and latency of the embedded default under concurrent clients.

    python -m benchmarks.bench_serving --concurrency 1,4,8 --max-tokens N --json OUT [--workload PATH]
        [--categories code_edit,chat] [--limit N] [--samplings greedy,seeded] [--dtype bf16] [--smoke]

Starts ``draftgate serve``'s app (the embedded default, SmolLM2-135M) in a child process
and drives it over HTTP with the real ``openai`` async client, streaming, closed loop:
``c`` workers each send the next workload item as soon as their last answer ended, every
item once per level. Each level runs with drafts off and on, greedy and seeded sampling.
``identical`` is the share of answers equal to the same item's answer at concurrency 1
without drafts (same sampling). ``--limit`` keeps N items taken in turn from each category
(so a short run stays mixed), ``--categories`` only those categories, ``--dtype`` sets the
local endpoint's dtype (default: the embedded default's). JSON: ``{"levels": [{"sampling", "concurrency", "drafts",
"output_tok_s", "req_s", "ttft_ms": {p50, p99}, "tpot_ms": {p50, p99}, "e2e_ms": {p50, p99},
"identical"}]}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import openai

from benchmarks.harness import (
    MODEL,
    WORKLOAD,
    counted,
    gateway,
    local_endpoint,
    parse,
    pct,
    workload,
    write_json,
)
from gateway.audit.workload import WorkloadItem
from gateway.progress import Task

SMOKE = ("--limit", "2", "--concurrency", "1,2", "--max-tokens", "4", "--samplings", "greedy")
SAMPLINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0},
    "seeded": {"temperature": 0.8, "seed": 1234},
}


async def _one(
    client: openai.AsyncOpenAI, item: WorkloadItem, extra: dict[str, Any]
) -> dict[str, Any]:
    began = time.perf_counter()
    first: float | None = None
    pieces: list[str] = []
    tokens = 0
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=item.messages,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    first = first or end
    return {
        "id": item.id,
        "text": "".join(pieces),
        "tokens": tokens,
        "ttft": first - began,
        "tpot": (end - first) / max(tokens - 1, 1),
        "e2e": end - began,
    }


async def _level(
    client: openai.AsyncOpenAI,
    items: list[WorkloadItem],
    concurrency: int,
    extra: dict[str, Any],
    task: Task,
) -> tuple[list[dict[str, Any]], float]:
    todo = list(items)
    done: list[dict[str, Any]] = []

    async def worker() -> None:
        while todo:
            done.append(await _one(client, todo.pop(0), extra))
            task.advance()

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - began


def _summary(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    def stat(key: str) -> dict[str, float]:
        values = [r[key] * 1000 for r in results]
        return {"p50": round(pct(values, 50), 1), "p99": round(pct(values, 99), 1)}

    return {
        "output_tok_s": round(sum(r["tokens"] for r in results) / wall, 2),
        "req_s": round(len(results) / wall, 3),
        "ttft_ms": stat("ttft"),
        "tpot_ms": stat("tpot"),
        "e2e_ms": stat("e2e"),
    }


async def _bench(
    url: str,
    items: list[WorkloadItem],
    levels: list[int],
    max_tokens: int,
    samplings: list[str],
) -> Any:
    out = []
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        for _ in range(120):  # the model loads and measures its step costs first
            try:
                await client.models.list()
                break
            except openai.APIConnectionError:
                await asyncio.sleep(1)
        await _one(client, items[0], {"max_tokens": 4})  # load the engine
        total = len(samplings) * len(levels) * 2 * len(items)
        with counted("requests", total) as task:
            for name in samplings:
                sampling = SAMPLINGS[name]
                reference: dict[str, str] = {}
                for concurrency in levels:
                    for drafts in (False, True):
                        extra = {
                            **sampling,
                            "max_tokens": max_tokens,
                            "extra_body": {"draftgate": {"draft": drafts}},
                        }
                        results, wall = await _level(client, items, concurrency, extra, task)
                        if not reference:
                            reference = {r["id"]: r["text"] for r in results}
                        same = sum(r["text"] == reference[r["id"]] for r in results)
                        row = {"sampling": name, "concurrency": concurrency, "drafts": drafts}
                        row |= _summary(results, wall)
                        row["identical"] = round(same / len(results), 3)
                        print(json.dumps(row), flush=True)
                        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=WORKLOAD, help="JSONL workload file")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", required=True)
    parser.add_argument("--categories", help="comma-separated categories (default: all)")
    parser.add_argument("--limit", type=int, help="at most N items, categories in turn")
    parser.add_argument("--samplings", default=",".join(SAMPLINGS), help="greedy,seeded")
    parser.add_argument("--dtype", help="the local endpoint's dtype (default: the embedded's)")
    args = parse(parser, SMOKE)
    categories = args.categories.split(",") if args.categories else ()
    items = workload(args.workload, categories, args.limit)
    samplings = args.samplings.split(",")
    if not items or any(s not in SAMPLINGS for s in samplings):
        parser.error("no items selected, or an unknown sampling")
    levels = sorted({int(c) for c in args.concurrency.split(",")})
    if levels[0] != 1:
        levels = [1, *levels]  # the reference answers come from concurrency 1
    config = local_endpoint(**({"dtype": args.dtype} if args.dtype else {}))
    with gateway(config, log_level="info") as served:
        rows = asyncio.run(_bench(served.url, items, levels, args.max_tokens, samplings))
    write_json(args.json, {"dtype": args.dtype or "default", "levels": rows})


if __name__ == "__main__":
    main()
