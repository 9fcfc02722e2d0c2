"""Prefix reuse on the embedded default: time to first token cold vs warm, over HTTP.

    python benchmarks/bench_prefix.py --json OUT [--max-tokens 8] [--system-tokens 3000]

Serves ``draftgate serve``'s app (the embedded default) in a child process and sends, one
at a time, streaming, with the real ``openai`` async client:
(a) multi-turn code-edit sessions: a system prompt and a file, then four follow-up
instructions, each turn carrying the earlier turns and answers;
(b) one long system prompt shared by 8 different questions, then the first question again.
Each scenario's text starts with a fresh nonce, so its first request is cold. ``identical``:
the repeated question's answer (a cache hit) equals its cold answer. The pool's size and
peak use come from ``/v1/endpoints/local/memory``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import MODEL, _free_port, _run_gateway  # noqa: E402

FILE = (
    "def load(path):\n    with open(path) as f:\n        return [line.strip() for line in f]\n\n"
    "def total(values):\n    result = 0\n    for v in values:\n        result += int(v)\n"
    "    return result\n\n"
)
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


async def _ask(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    began = loop.time()
    first: float | None = None
    pieces: list[str] = []
    cached = 0
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
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return {
        "ttft_ms": round(((first or loop.time()) - began) * 1000, 1),
        "cached_tokens": cached,
        "text": "".join(pieces),
    }


def _system(n_tokens: int) -> str:
    # about 40 tokens per copy of FILE with its header
    copies = max(n_tokens // 40, 1)
    body = "".join(f"# module {i}\n{FILE}" for i in range(copies))
    return f"[{uuid.uuid4().hex}] You are a code assistant. The project:\n{body}"


async def _sessions(client: openai.AsyncOpenAI, max_tokens: int, system_tokens: int) -> Any:
    messages = [
        {"role": "system", "content": _system(system_tokens // 2)},
        {"role": "user", "content": f"Here is the file:\n```python\n{FILE * 8}```"},
    ]
    turns = []
    for instruction in INSTRUCTIONS:
        messages.append({"role": "user", "content": instruction})
        answer = await _ask(client, messages, max_tokens)
        messages.append({"role": "assistant", "content": answer["text"]})
        turns.append({k: answer[k] for k in ("ttft_ms", "cached_tokens")})
    return {"turns": turns}


async def _shared(client: openai.AsyncOpenAI, max_tokens: int, system_tokens: int) -> Any:
    system = {"role": "system", "content": _system(system_tokens)}
    answers = [
        await _ask(client, [system, {"role": "user", "content": q}], max_tokens) for q in QUESTIONS
    ]
    again = await _ask(client, [system, {"role": "user", "content": QUESTIONS[0]}], max_tokens)
    cold = answers[0]["ttft_ms"]
    warm = [a["ttft_ms"] for a in answers[1:]]
    return {
        "cold_ttft_ms": cold,
        "warm_ttft_ms_p50": statistics.median(warm),
        "warm_over_cold": round(statistics.median(warm) / cold, 3),
        "cached_tokens": [a["cached_tokens"] for a in answers],
        "repeat_cached_tokens": again["cached_tokens"],
        "identical": again["text"] == answers[0]["text"],
    }


async def _bench(url: str, max_tokens: int, system_tokens: int) -> Any:
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as client:
        for _ in range(120):
            try:
                await client.models.list()
                break
            except openai.APIConnectionError:
                await asyncio.sleep(1)
        await _ask(client, [{"role": "user", "content": "hi"}], 2)  # load the engine
        result = {
            "sessions": await _sessions(client, max_tokens, system_tokens),
            "shared_prefix": await _shared(client, max_tokens, system_tokens),
        }
    async with httpx.AsyncClient() as http:
        memory = (await http.get(f"{url}/v1/endpoints/local/memory")).json()
    result["memory"] = {
        k: memory[k] for k in ("kv_reserved_bytes", "kv_peak_bytes", "kv_cached_bytes")
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=3000)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=_run_gateway, args=(port,), daemon=True
    )
    server.start()
    try:
        result = asyncio.run(
            _bench(f"http://127.0.0.1:{port}", args.max_tokens, args.system_tokens)
        )
    finally:
        server.terminate()
        server.join(10)
    print(json.dumps(result, indent=2))
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
