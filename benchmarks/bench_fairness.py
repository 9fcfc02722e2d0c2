"""An honest tenant alone, then beside an abusive one, on the embedded default engine: does
the engine share itself fairly?

    python -m benchmarks.bench_fairness --json OUT [--requests 4] [--max-tokens 128]
                                        [--abusers 5] [--smoke]

``draftgate serve`` (the embedded SmolLM2, two tenant keys and an admin key) serves an
honest tenant: two clients, each streaming ``--requests`` chat completions of the
project's workload one after another (greedy, ``--max-tokens`` tokens). Once untimed (so
both timed phases find the prompts in the prefix cache), then alone; then
while ``--abusers`` clients of another tenant send, in a loop, the worst requests they
may: ``n = 16``, no ``max_tokens`` (the endpoint's default), end of text banned, a
``logit_bias`` over the whole vocabulary, and the longest prediction the context allows.

Reported per phase: the honest TTFT and end-to-end percentiles, its errors, whether every
honest answer equals its answer alone (greedy, batch-invariant: it must), what the
abuser got back (answers, 429s, 503s), the engine's preemptions and its KV peak against
its pool; and the median over honest requests of each one's end-to-end time beside the
abuser over its time alone. Goals: honest TTFT p99 and e2e p50 within 2x of alone, no honest error, the
same honest text, the abuser throttled rather than served at the honest tenant's expense.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import MODEL, gateway, local_endpoint, parse, pct, workload, write_json

SMOKE = ("--requests", "1", "--max-tokens", "16", "--abusers", "1", "--prediction-tokens", "512")
KEYS = {"BENCH_HONEST": "honest-key-0123456789", "BENCH_ABUSER": "abuser-key-0123456789"}
ADMIN = ("BENCH_ADMIN", "admin-key-0123456789")
HONEST_CLIENTS = 2
VOCAB = 49152  # SmolLM2's
END_TOKENS = (0, 1, 2)  # <|endoftext|>, <|im_start|>, <|im_end|>


def _config() -> dict[str, Any]:
    config = local_endpoint()
    config["auth"] = True
    config["keys"] = [
        {"key_env": "BENCH_HONEST", "tenant": "honest"},
        {"key_env": "BENCH_ABUSER", "tenant": "abuser"},
        {"key_env": ADMIN[0], "tenant": "ops", "admin": True},
    ]
    return config


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class Phase:
    """What the honest clients and the abuser saw in one phase."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.texts: dict[str, str] = {}
        self.e2e_by_id: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        self.abuser: Counter[str] = Counter()

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            return {q: round(1000 * pct(values, p), 1) for q, p in (("p50", 50), ("p99", 99))}

        return {
            "answers": len(self.texts),
            "ttft_ms": stats(self.ttft),
            "ttft_ms_each": sorted(round(1000 * t, 1) for t in self.ttft),  # p99 of a few: the max
            "e2e_ms": stats(self.e2e),
            "errors": dict(self.errors),
            "abuser": dict(self.abuser),
        }


async def _honest(
    session: aiohttp.ClientSession, url: str, items: list[Any], max_tokens: int, phase: Phase
) -> None:
    for item in items:
        body = {
            "model": MODEL,
            "messages": item.messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        t0 = time.perf_counter()
        first, text = None, []
        try:
            async with session.post(
                f"{url}/v1/chat/completions", json=body, headers=_auth(KEYS["BENCH_HONEST"])
            ) as r:
                if r.status != 200:
                    phase.errors[f"status {r.status}"] += 1
                    await r.read()
                    continue
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        phase.errors["stream error"] += 1
                        break
                    for choice in chunk.get("choices", []):
                        content = (choice.get("delta") or {}).get("content")
                        if content:
                            first = first or time.perf_counter() - t0
                            text.append(content)
        except (aiohttp.ClientError, TimeoutError) as exc:
            phase.errors[type(exc).__name__] += 1
            continue
        if first is not None:
            phase.ttft.append(first)
            phase.e2e.append(time.perf_counter() - t0)
            phase.e2e_by_id[item.id] = phase.e2e[-1]
            phase.texts[item.id] = "".join(text)


def _abusive_body(prediction_tokens: int) -> bytes:
    bias = {str(t): (-100 if t in END_TOKENS else 0.01) for t in range(VOCAB)}
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write forever."}],
            "n": 16,
            "logit_bias": bias,
            "prediction": {"type": "content", "content": " x" * prediction_tokens},
            "stream": True,
        }
    ).encode()


async def _abuse(session: aiohttp.ClientSession, url: str, body: bytes, phase: Phase) -> None:
    headers = {**_auth(KEYS["BENCH_ABUSER"]), "content-type": "application/json"}
    while True:
        try:
            async with session.post(f"{url}/v1/chat/completions", data=body, headers=headers) as r:
                if r.status != 200:
                    await r.read()
                    phase.abuser[f"status {r.status}"] += 1
                    await asyncio.sleep(0.2)  # keeps asking, a little slower than flat out
                    continue
                phase.abuser["admitted"] += 1
                async for _ in r.content.iter_any():
                    pass
                phase.abuser["finished"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            phase.abuser[type(exc).__name__] += 1


async def _phase(url: str, args: argparse.Namespace, abusers: int) -> Phase:
    phase = Phase()
    items = workload(limit=HONEST_CLIENTS * args.requests)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        body = _abusive_body(args.prediction_tokens)
        abusing = [asyncio.create_task(_abuse(session, url, body, phase)) for _ in range(abusers)]
        if abusing:
            await asyncio.sleep(args.abuser_lead_s)  # the abuser's requests come first
        honest = [
            _honest(session, url, items[c::HONEST_CLIENTS], args.max_tokens, phase)
            for c in range(HONEST_CLIENTS)
        ]
        await asyncio.gather(*honest)
        for task in abusing:  # its connections close: the engine cancels its answers
            task.cancel()
        await asyncio.gather(*abusing, return_exceptions=True)
    return phase


async def _engine_figures(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession(headers=_auth(ADMIN[1])) as session:
        async with session.get(f"{url}/v1/endpoints/local/memory") as r:
            memory = await r.json()
        async with session.get(f"{url}/metrics") as r:
            metrics = await r.text()
    found = re.search(
        r'^draftgate_local_preemptions_total\{endpoint="local"\} (\S+)', metrics, re.M
    )
    return {
        "preemptions": int(float(found.group(1))) if found else 0,
        "kv_peak_bytes": memory["kv_peak_bytes"],
        "kv_reserved_bytes": memory["kv_reserved_bytes"],
        "within_pool": memory["kv_peak_bytes"] <= memory["kv_reserved_bytes"],
    }


async def _warm(url: str) -> None:
    """One untimed request: the model loads and the engine measures its step costs."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session,
        session.post(
            f"{url}/v1/chat/completions", json=body, headers=_auth(KEYS["BENCH_HONEST"])
        ) as r,
    ):
        r.raise_for_status()
        await r.read()


def paired(alone: dict[str, float], beside: dict[str, float]) -> float | None:
    """The median over requests answered in both phases of beside / alone."""
    ratios = [beside[i] / alone[i] for i in alone if i in beside and alone[i] > 0]
    return round(statistics.median(ratios), 2) if ratios else None


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    environ = {**KEYS, ADMIN[0]: ADMIN[1]}
    with gateway(_config(), environ) as served:
        await _warm(served.url)
        await _phase(served.url, args, 0)  # untimed: both timed phases find prompts cached
        alone = await _phase(served.url, args, 0)
        beside = await _phase(served.url, args, args.abusers)
        engine = await _engine_figures(served.url)
    same = [beside.texts.get(i) == text for i, text in alone.texts.items()]
    alone_s, beside_s = alone.summary(), beside.summary()

    def ratio(metric: str, q: str) -> float | None:
        base = alone_s[metric][q]
        return round(beside_s[metric][q] / base, 2) if base else None

    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "alone": alone_s,
        "beside_abuser": beside_s,
        "honest_text_identical": all(same) and len(same) == len(beside.texts),
        "ttft_p99_ratio": ratio("ttft_ms", "p99"),
        "e2e_p50_ratio": ratio("e2e_ms", "p50"),
        # each request beside the abuser over the same request alone, the median: the
        # p50 of a few requests of very different lengths moves with which one is middle
        "e2e_paired_ratio_p50": paired(alone.e2e_by_id, beside.e2e_by_id),
        "engine": engine,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--requests", type=int, default=4, help="per honest client")
    parser.add_argument("--max-tokens", type=int, default=128, help="per honest answer")
    parser.add_argument("--abusers", type=int, default=5, help="abusive clients at once")
    parser.add_argument(
        "--prediction-tokens", type=int, default=7000, help="the abuser's prediction, tokens"
    )
    parser.add_argument(
        "--abuser-lead-s", type=float, default=2.0, help="the abuser starts this much earlier"
    )
    args = parse(parser, SMOKE)
    result = asyncio.run(_run(args))
    write_json(args.json, result)
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=2))


if __name__ == "__main__":
    main()
