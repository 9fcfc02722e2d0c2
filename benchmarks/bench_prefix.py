"""Prefix reuse on the local target: time to first token warm vs cold, over HTTP.

    python -m benchmarks.bench_prefix --json OUT [--system-tokens 3000] [--file-tokens 2000]
        [--sessions 2] [--questions 8] [--cold-requests 8] [--max-tokens 16] [--smoke]

Serves two gateways as ``draftgate serve`` runs them (one local endpoint on SmolLM2-135M),
each in a child process: ``reuse`` (the default) and ``cold`` (``prefix_cache = false``: no
K/V or drafter-index reuse). Every request goes, streaming, with the real ``openai`` async
client, to ``reuse`` and then with the same messages to ``cold``, one at a time:

- ``nothing_shared``: the workload's first requests (distinct prompts; the order of the
  two gateways alternates): TTFT with reuse built in vs without (goal: within 5%);
- ``sessions``: multi-turn code edits: a system prompt (a third of ``--system-tokens``), a
  file of ``--file-tokens``, four follow-up instructions, each turn carrying the earlier
  turns and answers;
- ``shared_prefix``: one ``--system-tokens`` system prompt shared by ``--questions``
  different questions, then the first question again;
- ``repeat_series``: the workload's ``repeat`` series in order, then once more.

Each scenario's text starts with a fresh nonce, so its first request is cold. Warm TTFT
is compared with the ``cold`` gateway's TTFT for the same messages (``warm_over_cold``;
goal <= 0.1 for a shared prefix of >= 2k tokens) and every ``reuse`` answer with the
``cold`` one (greedy: ``identical`` must be 100%). ``memory``: each pool's size and peak
use, from ``/v1/endpoints/local/memory``. ``--smoke`` shrinks everything to a seconds-long run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import openai

from benchmarks.harness import MODEL, gateway, local_endpoint, parse, workload, write_json

TURNS = 4
SMOKE = (
    *("--system-tokens", "120", "--file-tokens", "80", "--sessions", "1", "--questions", "2"),
    *("--cold-requests", "2", "--repeat-items", "2", "--max-tokens", "4", "--kv-cache-mb", "32"),
)
FILE = (
    "def load(path):\n    with open(path) as f:\n        return [line.strip() for line in f]\n\n"
    "def total(values):\n    result = 0\n    for v in values:\n        result += int(v)\n"
    "    return result\n\n"
)
FILE_TOKENS = 40  # about, per copy of FILE with its header
INSTRUCTIONS = [
    "Rename `load` to `read_lines`.",
    "Add type hints to every function.",
    "Make `total` use the built-in sum.",
    "Add a docstring to each function.",
]
QUESTIONS = [
    "What does `load` return?",
    "Which function adds numbers?",
    "Is there any error handling?",
    "How many functions are there?",
    "What is the file opened with?",
    "Could `total` fail? How?",
    "Suggest a better name for `total`.",
    "Summarise the code in one line.",
]
Messages = list[dict[str, str]]


async def _ask(client: openai.AsyncOpenAI, messages: Messages, max_tokens: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    began = loop.time()
    first: float | None = None
    pieces: list[str] = []
    cached = prompt = 0
    stream = await client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or loop.time()
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
    return {
        "ttft_ms": round(((first or loop.time()) - began) * 1000, 1),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "text": "".join(pieces),
    }


class Pair:
    """The two gateways; ``ask`` sends the same messages to both and keeps every row."""

    def __init__(self, reuse: openai.AsyncOpenAI, cold: openai.AsyncOpenAI, max_tokens: int):
        self.reuse = reuse
        self.cold = cold
        self.max_tokens = max_tokens
        self.rows: list[dict[str, Any]] = []

    async def ask(self, label: str, messages: Messages, cold_first: bool = False) -> dict[str, Any]:
        """Row: reuse's TTFT, tokens and text, the cold gateway's TTFT, identical answers."""
        if cold_first:
            cold = await _ask(self.cold, messages, self.max_tokens)
            warm = await _ask(self.reuse, messages, self.max_tokens)
        else:
            warm = await _ask(self.reuse, messages, self.max_tokens)
            cold = await _ask(self.cold, messages, self.max_tokens)
        row = {
            "label": label,
            "prompt_tokens": warm["prompt_tokens"],
            "cached_tokens": warm["cached_tokens"],
            "ttft_ms": warm["ttft_ms"],
            "cold_ttft_ms": cold["ttft_ms"],
            "warm_over_cold": round(warm["ttft_ms"] / cold["ttft_ms"], 3),
            "identical": warm["text"] == cold["text"],
            "text": warm["text"],
        }
        self.rows.append(row)
        print(
            f"{label}: {row['prompt_tokens']} prompt ({row['cached_tokens']} cached) "
            f"TTFT {row['ttft_ms']} vs cold {row['cold_ttft_ms']} ms, "
            f"identical={row['identical']}",
            file=sys.stderr,
            flush=True,
        )
        return row


def _public(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "text"} for r in rows]


def _warm_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The rows that hit the cache: median warm/cold TTFT ratio and shared tokens."""
    hits = [r for r in rows if r["cached_tokens"]]
    if not hits:
        return {"hits": 0}
    return {
        "hits": len(hits),
        "cached_tokens_min": min(r["cached_tokens"] for r in hits),
        "warm_ttft_ms_p50": statistics.median(r["ttft_ms"] for r in hits),
        "cold_ttft_ms_p50": statistics.median(r["cold_ttft_ms"] for r in hits),
        "warm_over_cold_p50": statistics.median(r["warm_over_cold"] for r in hits),
    }


def _text(n_tokens: int) -> str:
    copies = max(n_tokens // FILE_TOKENS, 1)
    return "".join(f"# module {i}\n{FILE}" for i in range(copies))


def _system(n_tokens: int) -> dict[str, str]:
    body = _text(n_tokens)
    return {
        "role": "system",
        "content": f"[{uuid.uuid4().hex}] You are a code assistant. The project:\n{body}",
    }


async def _nothing_shared(pair: Pair, n: int) -> dict[str, Any]:
    items = [i for i in workload() if not i.series][:n]
    rows = []
    for k, item in enumerate(items):
        nonce = {"role": "system", "content": f"[{uuid.uuid4().hex}]"}
        rows.append(await pair.ask(f"first/{item.id}", [nonce, *item.messages], k % 2 == 1))
    with_, without = [r["ttft_ms"] for r in rows], [r["cold_ttft_ms"] for r in rows]
    return {
        "requests": _public(rows),
        "ttft_ms_p50_with_reuse": statistics.median(with_),
        "ttft_ms_p50_without": statistics.median(without),
        "with_over_without": round(statistics.median(with_) / statistics.median(without), 3),
    }


async def _sessions(pair: Pair, sessions: int, system_tokens: int, file_tokens: int) -> Any:
    out = []
    for s in range(sessions):
        messages = [
            _system(system_tokens // 3),
            {"role": "user", "content": f"Here is the file:\n```python\n{_text(file_tokens)}```"},
        ]
        turns = []
        for t, instruction in enumerate(INSTRUCTIONS[:TURNS]):
            messages.append({"role": "user", "content": instruction})
            row = await pair.ask(f"session{s}/turn{t}", messages)
            messages.append({"role": "assistant", "content": row["text"]})
            turns.append(row)
        out.append({"turns": _public(turns), "warm": _warm_summary(turns[1:])})
    return out


async def _shared(pair: Pair, questions: int, system_tokens: int) -> Any:
    system = _system(system_tokens)
    rows = [
        await pair.ask(f"shared/q{i}", [system, {"role": "user", "content": q}])
        for i, q in enumerate(QUESTIONS[:questions])
    ]
    again = await pair.ask("shared/q0-again", [system, {"role": "user", "content": QUESTIONS[0]}])
    return {
        "questions": _public(rows),
        "again": _public([again])[0],
        "again_equals_first": again["text"] == rows[0]["text"],
        "warm": _warm_summary(rows[1:]),
    }


async def _repeat(pair: Pair, n: int) -> Any:
    items = workload(categories=["repeat"])[:n]
    nonce = {"role": "system", "content": f"[{uuid.uuid4().hex}]"}
    passes = []
    for p in range(2):  # the series, then the same requests again
        rows = [await pair.ask(f"repeat/pass{p}/{i.id}", [nonce, *i.messages]) for i in items]
        passes.append({"requests": _public(rows), "warm": _warm_summary(rows)})
    return passes


async def _ready(client: openai.AsyncOpenAI, timeout_s: float) -> None:
    for _ in range(int(timeout_s)):
        try:
            await client.models.list()
            break
        except openai.APIConnectionError:
            await asyncio.sleep(1)
    await _ask(client, [{"role": "user", "content": "hi"}], 1)  # loads the engine


async def _memory(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=60) as http:
        memory = (await http.get(f"{url}/v1/endpoints/local/memory")).json()
    keys = ("kv_reserved_bytes", "kv_peak_bytes", "kv_in_use_bytes", "kv_cached_bytes")
    return {k: memory[k] for k in keys if k in memory}


async def _bench(urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    def client(url: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=args.timeout
        )

    async with client(urls["reuse"]) as reuse, client(urls["cold"]) as cold:
        await asyncio.gather(_ready(reuse, args.timeout), _ready(cold, args.timeout))
        pair = Pair(reuse, cold, args.max_tokens)
        result: dict[str, Any] = {
            "options": {k: v for k, v in vars(args).items() if k != "json"},
            "nothing_shared": await _nothing_shared(pair, args.cold_requests),
            "sessions": await _sessions(pair, args.sessions, args.system_tokens, args.file_tokens),
            "shared_prefix": await _shared(pair, args.questions, args.system_tokens),
            "repeat_series": await _repeat(pair, args.repeat_items),
        }
    rows = pair.rows
    result["identical"] = {
        "answers": len(rows),
        "identical": sum(r["identical"] for r in rows),
        "with_hits": sum(1 for r in rows if r["cached_tokens"]),
        "with_hits_identical": sum(1 for r in rows if r["cached_tokens"] and r["identical"]),
    }
    long = [r for r in rows if r["cached_tokens"] >= 2048]
    result["goal_long_prefix"] = {
        "requests": len(long),
        "warm_over_cold_p50": statistics.median(r["warm_over_cold"] for r in long)
        if long
        else None,
        "warm_over_cold_max": max((r["warm_over_cold"] for r in long), default=None),
    }
    result["memory"] = {name: await _memory(url) for name, url in urls.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--file-tokens", type=int, default=2000)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--questions", type=int, default=8, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--cold-requests", type=int, default=8, help="nothing-shared requests")
    parser.add_argument("--repeat-items", type=int, default=4, help="of the repeat series")
    parser.add_argument("--kv-cache-mb", type=float, default=512)
    parser.add_argument("--timeout", type=float, default=3600, help="per request, seconds")
    args = parse(parser, SMOKE)
    with contextlib.ExitStack() as servers:
        urls = {
            name: servers.enter_context(
                gateway(local_endpoint(prefix_cache=on, kv_cache_mb=args.kv_cache_mb))
            ).url
            for name, on in (("reuse", True), ("cold", False))
        }
        result = asyncio.run(_bench(urls, args))
    print(json.dumps(result, indent=2))
    write_json(args.json, result)


if __name__ == "__main__":
    main()
