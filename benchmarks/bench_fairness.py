"""An honest tenant alone, then beside an abusive one, on the embedded default engine: does
the engine share itself fairly, whatever the abuser sends?

    python -m benchmarks.bench_fairness --json OUT [--abusers NAME,...] [--runs 3]
                                        [--requests 4] [--max-tokens 128]
                                        [--abuser-clients 5] [--kv-cache-mb MB] [--smoke]

``draftgate serve`` (the embedded SmolLM2, two tenant keys and an admin key) serves an
honest tenant: two clients, each streaming ``--requests`` chat completions of the
project's workload one after another (greedy, ``--max-tokens`` tokens). Once untimed (so
every timed phase finds the prompts in the prefix cache); then, in each of ``--runs``
runs, the honest tenant alone, and beside each abuser of ``--abusers`` in turn:
``--abuser-clients`` clients of another tenant sending its requests in a loop (a refused
one is asked again 0.2 s later, unless said otherwise), in a process of their own (the
answers they read take no time from the honest clients' event loop). The abusers (``n = 16``, no ``max_tokens``, end of text
banned, unless said otherwise):

- ``sampled_resend``: temperature 0.8, not streamed, the client hangs up after
  ``--hang-up-s`` and sends it again; ``greedy_resend``: the same, greedy;
  ``sampled_stream_resend``: sampled, streamed, hangs up likewise;
- ``sampled_wait``: sampled, not streamed, the client waits for the answer;
  ``sampled_n1``: the same with ``n = 1``;
- ``vocab_bias``: a ``logit_bias`` over the whole vocabulary and the longest prediction
  the context allows, streamed;
- ``long_drafts``: greedy repetitive text with a prediction of that text (long accepted
  drafts: many rows a step);
- ``long_prompts``: ``n = 1`` prompts of ``--long-prompt-tokens`` tokens of source code,
  16 tokens each;
- ``many_stops``: sampled, with the most stop strings a request may carry, each of the
  longest length, that the text keeps almost matching;
- ``grammars``: sampled, with a JSON schema of many properties (a grammar mask each row);
- ``wrong_key_flood``: a small request with a key the gateway does not know, sent again as
  soon as it is refused (nothing admitted: the gateway's and the load generator's CPU
  beside the engine; past ``limits.unauthenticated_per_minute`` the gateway holds each
  429 ``limits.over_limit_hold_s`` before answering it).

A run takes ``1 + len(abusers)`` phases; one beside an abuser within the goals lasts
about two alone phases (plus ``--abuser-lead-s``), so after the first alone phase the
benchmark prints (on stderr) when it should end.

Reported per abuser and run: the honest TTFT and end-to-end percentiles beside it, the
ratios to the run's alone phase (e2e p50, TTFT p99, and the median over honest requests of
each one's e2e beside over alone), honest errors, the honest prompts' tokens and those of
them found in the prefix cache, whether every honest answer equals its
answer alone (greedy, batch-invariant: it must), what the abuser got back (answers, 429s,
hang-ups), the CPU seconds the load generator (both its processes, and the abusers' own
apart), the gateway process and the whole machine used in the phase, its wall
seconds, and how long before it the engine took to hold no request of the phase before
(each phase starts only then); per abuser over the runs, each ratio's median and its spread (min, max), and the
median CPU and wall seconds. Then the engine's preemptions and its KV peak against its
pool. Goals: honest TTFT p99 and e2e p50 within 2x of alone, no honest error, the same
honest text, the abuser throttled rather than served at the honest tenant's expense.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.harness import (
    MODEL,
    SPAWN,
    cpu_s,
    gateway,
    local_endpoint,
    machine_busy_s,
    parse,
    pct,
    stdlib_slices,
    steps,
    workload,
    write_json,
)

SMOKE = (
    "--requests", "1", "--max-tokens", "16", "--abusers", "sampled_resend",
    "--abuser-clients", "1", "--runs", "1", "--hang-up-s", "2",
)  # fmt: skip
KEYS = {"BENCH_HONEST": "honest-key-0123456789", "BENCH_ABUSER": "abuser-key-0123456789"}
ADMIN = ("BENCH_ADMIN", "admin-key-0123456789")
HONEST_CLIENTS = 2
VOCAB = 49152  # SmolLM2's
END_TOKENS = (0, 1, 2)  # <|endoftext|>, <|im_start|>, <|im_end|>
RETRY_REFUSED_S = 0.2  # a refused abuser asks again after this
REPEATED = "the cat sat on the mat and the dog sat on the log.\n"


def _config(kv_cache_mb: float | None) -> dict[str, Any]:
    config = local_endpoint(**({} if kv_cache_mb is None else {"kv_cache_mb": kv_cache_mb}))
    config["auth"] = True
    config["keys"] = [
        {"key_env": "BENCH_HONEST", "tenant": "honest"},
        {"key_env": "BENCH_ABUSER", "tenant": "abuser"},
        {"key_env": ADMIN[0], "tenant": "ops", "admin": True},
    ]
    return config


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@dataclass(frozen=True)
class Abuser:
    """What an abusive client sends in a loop, and whether it hangs up on its answer."""

    body: dict[str, Any]
    hang_up: bool = False
    key: str = KEYS["BENCH_ABUSER"]
    pause_s: float = RETRY_REFUSED_S  # before asking again once refused


def _abusers(args: argparse.Namespace) -> dict[str, Abuser]:
    ban = {str(t): -100 for t in END_TOKENS}
    base = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write forever."}],
        "n": 16,
        "logit_bias": ban,
    }
    sampled, greedy = {**base, "temperature": 0.8}, {**base, "temperature": 0}
    whole_vocab = {str(t): (-100 if t in END_TOKENS else 0.01) for t in range(VOCAB)}
    (source,) = stdlib_slices(4 * args.long_prompt_tokens, 1)  # about 4 characters a token
    near = "the cat sat on the mat and the dog sat on the log and the cat sat on the" * 14
    schema = {
        "type": "object",
        "properties": {
            f"field_{i}": {"type": "string", "enum": [f"value {i} {j}" for j in range(8)]}
            for i in range(48)
        },
        "required": [f"field_{i}" for i in range(48)],
    }
    return {
        "sampled_resend": Abuser(sampled, hang_up=True),
        "greedy_resend": Abuser(greedy, hang_up=True),
        "sampled_stream_resend": Abuser({**sampled, "stream": True}, hang_up=True),
        "sampled_wait": Abuser(sampled),
        "sampled_n1": Abuser({**sampled, "n": 1}),
        "vocab_bias": Abuser(
            {
                **base,
                "logit_bias": whole_vocab,
                "prediction": {"type": "content", "content": " x" * args.prediction_tokens},
                "stream": True,
            }
        ),
        "long_drafts": Abuser(
            {
                **greedy,
                "messages": [{"role": "user", "content": f"Repeat this line forever: {REPEATED}"}],
                "prediction": {"type": "content", "content": REPEATED * 200},
            }
        ),
        "long_prompts": Abuser(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Summarise:\n{source}"}],
                "max_tokens": 16,
                "temperature": 0.8,
            }
        ),
        "wrong_key_flood": Abuser(
            {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            key="not-a-key-0123456789",
            pause_s=0.0,
        ),
        "many_stops": Abuser({**sampled, "stop": [near[:1023] + str(i) for i in range(4)]}),
        "grammars": Abuser(
            {
                **sampled,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "fields", "schema": schema, "strict": True},
                },
            }
        ),
    }


ABUSERS = (
    "sampled_resend", "greedy_resend", "sampled_stream_resend", "sampled_wait", "sampled_n1",
    "vocab_bias", "long_drafts", "long_prompts", "many_stops", "grammars", "wrong_key_flood",
)  # fmt: skip


class Phase:
    """What the honest clients and the abuser saw in one phase."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.texts: dict[str, str] = {}
        self.e2e_by_id: dict[str, float] = {}
        self.errors: Counter[str] = Counter()
        self.abuser: Counter[str] = Counter()
        self.prompt_tokens = 0  # the honest prompts' tokens, and those the prefix cache held
        self.cached_tokens = 0
        self.cpu_s: dict[str, float] = {}
        self.wall_s = 0.0
        self.settle_s = 0.0  # before it: until the engine held no request of an earlier phase

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float]:
            if not values:
                return {}
            return {q: round(1000 * pct(values, p), 1) for q, p in (("p50", 50), ("p99", 99))}

        return {
            "answers": len(self.texts),
            "ttft_ms": stats(self.ttft),
            "ttft_ms_each": sorted(round(1000 * t, 1) for t in self.ttft),  # p99 of a few: the max
            "e2e_ms": stats(self.e2e),
            "errors": dict(self.errors),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "abuser": dict(self.abuser),
            "cpu_s": {k: round(v, 3) for k, v in self.cpu_s.items()},
            "wall_s": round(self.wall_s, 1),
            "settle_s": round(self.settle_s, 2),
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
            "stream_options": {"include_usage": True},
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
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        phase.prompt_tokens += usage["prompt_tokens"]
                        details = usage.get("prompt_tokens_details") or {}
                        phase.cached_tokens += details.get("cached_tokens", 0)
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


async def _abuse(
    session: aiohttp.ClientSession, url: str, abuser: Abuser, hang_up_s: float, got: Counter[str]
) -> None:
    """The abuser's requests in a loop; one that hangs up closes its connection after
    ``hang_up_s`` (the gateway cancels the answer) and sends the request again."""
    headers = {**_auth(abuser.key), "content-type": "application/json"}
    body = json.dumps(abuser.body).encode()
    while True:
        try:
            async with asyncio.timeout(hang_up_s if abuser.hang_up else None):
                async with session.post(
                    f"{url}/v1/chat/completions", data=body, headers=headers
                ) as r:
                    if r.status != 200:
                        await r.read()
                        got[f"status {r.status}"] += 1
                        await asyncio.sleep(abuser.pause_s)
                        continue
                    got["admitted"] += 1
                    async for _ in r.content.iter_any():
                        pass
                    got["finished"] += 1
        except TimeoutError:
            got["hung up"] += 1
        except aiohttp.ClientError as exc:
            got[type(exc).__name__] += 1


def _abusers_process(
    url: str, abuser: Abuser, hang_up_s: float, clients: int, conn: Connection
) -> None:
    """The abusive clients, in a process of their own (so the answers they read take no
    time from the honest clients' loop): ``"started"`` on ``conn`` once they send, then,
    at any message on ``conn``, they stop and send back what they got and their CPU
    seconds since they started."""
    asyncio.run(_abuse_until_told(url, abuser, hang_up_s, clients, conn))


async def _abuse_until_told(
    url: str, abuser: Abuser, hang_up_s: float, clients: int, conn: Connection
) -> None:
    got: Counter[str] = Counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(conn.fileno(), stop.set)
    cpu0 = time.process_time()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks = [
            asyncio.create_task(_abuse(session, url, abuser, hang_up_s, got))
            for _ in range(clients)
        ]
        conn.send("started")
        await stop.wait()
        loop.remove_reader(conn.fileno())
        conn.recv()
        for task in tasks:  # its connections close: the engine cancels its answers
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    conn.send((dict(got), time.process_time() - cpu0))


@dataclass
class _Abused:
    """What the abusers got back, and their process's CPU seconds."""

    got: Counter[str] = field(default_factory=Counter)
    cpu_s: float = 0.0


@contextlib.asynccontextmanager
async def _abusing(
    url: str, abuser: Abuser | None, args: argparse.Namespace
) -> AsyncIterator[_Abused]:
    """The abusers running in their own process while the block runs (none: nothing);
    what they got is in the yielded :class:`_Abused` once the block ended."""
    abused = _Abused()
    if abuser is None:
        yield abused
        return
    ours, theirs = SPAWN.Pipe()
    proc = SPAWN.Process(
        target=_abusers_process,
        args=(url, abuser, args.hang_up_s, args.abuser_clients, theirs),
        daemon=True,
    )
    proc.start()
    try:
        if await asyncio.to_thread(ours.recv) != "started":
            raise RuntimeError("the abusers' process did not start")
        yield abused
        ours.send("stop")
        got, abused.cpu_s = await asyncio.to_thread(ours.recv)
        abused.got.update(got)
        await asyncio.to_thread(proc.join, 30)
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)


async def _settled(url: str, limit_s: float = 120.0) -> float:
    """Seconds until the engine holds no KV block for a request (the abusers' cancelled
    answers of the phase before have ended), polled every 50 ms; at most ``limit_s``."""
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(headers=_auth(ADMIN[1])) as session:
        while time.perf_counter() - t0 < limit_s:
            async with session.get(f"{url}/v1/endpoints/local/memory") as r:
                if (await r.json())["kv_in_use_bytes"] == 0:
                    break
            await asyncio.sleep(0.05)
    return time.perf_counter() - t0


async def _phase(url: str, pid: int, args: argparse.Namespace, abuser: Abuser | None) -> Phase:
    phase = Phase()
    phase.settle_s = await _settled(url)
    items = workload(limit=HONEST_CLIENTS * args.requests)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=3600)
    async with _abusing(url, abuser, args) as abused:
        t0, machine0 = time.perf_counter(), machine_busy_s()
        cpu0, gateway0 = time.process_time(), cpu_s(pid)
        if abuser is not None:
            await asyncio.sleep(args.abuser_lead_s)  # the abuser's requests come first
        async with aiohttp.ClientSession(timeout=timeout) as session:
            honest = [
                _honest(session, url, items[c::HONEST_CLIENTS], args.max_tokens, phase)
                for c in range(HONEST_CLIENTS)
            ]
            await asyncio.gather(*honest)
    honest_cpu = time.process_time() - cpu0
    phase.abuser = abused.got
    phase.cpu_s = {  # the load generator's: both its processes
        "load_generator": honest_cpu + abused.cpu_s,
        "load_generator_abusers": abused.cpu_s,
        "gateway_and_engine": cpu_s(pid) - gateway0,
        "machine": machine_busy_s() - machine0,
    }
    phase.wall_s = time.perf_counter() - t0
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


def _compare(alone: Phase, beside: Phase) -> dict[str, Any]:
    """One abuser's phase beside the run's alone phase."""
    alone_s, beside_s = alone.summary(), beside.summary()

    def ratio(metric: str, q: str) -> float | None:
        base, value = alone_s[metric].get(q), beside_s[metric].get(q)
        return round(value / base, 2) if base and value is not None else None

    same = [beside.texts.get(i) == text for i, text in alone.texts.items()]
    return {
        "beside_abuser": beside_s,
        "honest_text_identical": all(same) and len(same) == len(beside.texts),
        "ttft_p99_ratio": ratio("ttft_ms", "p99"),
        "e2e_p50_ratio": ratio("e2e_ms", "p50"),
        # each request beside the abuser over the same request alone, the median: the
        # p50 of a few requests of very different lengths moves with which one is middle
        "e2e_paired_ratio_p50": paired(alone.e2e_by_id, beside.e2e_by_id),
    }


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each ratio's median and range over the runs, the phases' median CPU and wall
    seconds, and every run's honest errors."""
    out: dict[str, Any] = {}
    for key in ("e2e_p50_ratio", "ttft_p99_ratio", "e2e_paired_ratio_p50"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = (
            {"median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}
            if values
            else None
        )
    phases = [r["beside_abuser"] for r in runs]
    out["cpu_s_median"] = {  # the load generator's own, the server's, the whole machine's
        k: round(statistics.median(p["cpu_s"][k] for p in phases), 3) for k in phases[0]["cpu_s"]
    }
    out["wall_s_median"] = round(statistics.median(p["wall_s"] for p in phases), 1)
    out["honest_errors"] = sum(sum(r["beside_abuser"]["errors"].values()) for r in runs)
    out["honest_text_identical"] = all(r["honest_text_identical"] for r in runs)
    return out


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    environ = {**KEYS, ADMIN[0]: ADMIN[1]}
    abusers = _abusers(args)
    alone_runs: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.abusers}
    t0 = time.perf_counter()
    with gateway(_config(args.kv_cache_mb), environ) as served:
        url, pid = served.url, served.pid
        await _warm(url)
        await _phase(url, pid, args, None)  # untimed: every timed phase finds prompts cached
        for run in steps(range(args.runs), "runs (alone, then beside each abuser)"):
            alone = await _phase(url, pid, args, None)
            alone_runs.append(alone.summary())
            if run == 0:
                _estimate(alone.wall_s, args, time.perf_counter() - t0)
            for name in args.abusers:
                runs[name].append(_compare(alone, await _phase(url, pid, args, abusers[name])))
        engine = await _engine_figures(url)
    return {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "wall_s": round(time.perf_counter() - t0, 1),
        "alone": alone_runs,
        "abusers": {name: {**_spread(r), "runs": r} for name, r in runs.items()},
        "engine": engine,
    }


def _estimate(alone_s: float, args: argparse.Namespace, spent_s: float) -> None:
    """On stderr: when the whole run ends if every abuser keeps the honest phase within
    its 2x goal (one that does not lengthens its phases by its own ratio)."""
    beside = args.runs * len(args.abusers)
    left_s = (args.runs - 1) * alone_s + beside * (2 * alone_s + args.abuser_lead_s)
    print(
        f"the alone phase took {alone_s:.0f} s: the whole run ends in about "
        f"{(spent_s + left_s) / 60:.0f} min if every abuser stays within 2x",
        file=sys.stderr,
    )


def _names(value: str) -> tuple[str, ...]:
    names = tuple(value.split(","))
    unknown = set(names) - set(ABUSERS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown abusers: {', '.join(sorted(unknown))}")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument(
        "--abusers", type=_names, default=ABUSERS, help=f"comma-separated: {','.join(ABUSERS)}"
    )
    parser.add_argument("--runs", type=int, default=3, help="alone, then beside each abuser")
    parser.add_argument("--requests", type=int, default=4, help="per honest client")
    parser.add_argument("--max-tokens", type=int, default=128, help="per honest answer")
    parser.add_argument("--abuser-clients", type=int, default=5, help="abusive clients at once")
    parser.add_argument(
        "--hang-up-s", type=float, default=5.0, help="the hanging-up abusers hang up after this"
    )
    parser.add_argument(
        "--prediction-tokens", type=int, default=7000, help="vocab_bias's prediction, tokens"
    )
    parser.add_argument(
        "--long-prompt-tokens", type=int, default=6000, help="long_prompts' prompt, tokens"
    )
    parser.add_argument(
        "--abuser-lead-s", type=float, default=2.0, help="the abuser starts this much earlier"
    )
    parser.add_argument(
        "--kv-cache-mb",
        type=float,
        help="the KV pool's size (the endpoint's default if not given): a small one fills "
        "with the abusers' answers within a phase on a fast machine",
    )
    args = parse(parser, SMOKE)
    result = asyncio.run(_run(args))
    write_json(args.json, result)
    summary = {
        name: {k: v for k, v in a.items() if k != "runs"} for name, a in result["abusers"].items()
    }
    print(json.dumps({"abusers": summary, "engine": result["engine"]}, indent=2))


if __name__ == "__main__":
    main()
