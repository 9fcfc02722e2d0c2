"""Remote verification vs pass-through, through the gateway, against the SGLang stand-in
(``tests/remote_standin.py``, the real SmolLM2 engine behind SGLang's ``/generate``).

    python -m benchmarks.bench_remote --workload PATH --max-tokens N --json OUT [--smoke]
        [--limit K] [--categories code_edit,...] [--round-trip-s S --token-s S]
        [--healthz [--unknown-context]]

Every workload item is asked twice, greedy and not streamed: once with drafting off (the
gateway passes it through to the stand-in's own decoding) and once remotely verified
(the item's prediction and prompt drafted by the gateway, scored by the stand-in). Per
category: ``remote_tok_s`` and ``passthrough_tok_s`` (output tokens over wall seconds),
``round_trips_per_token`` (scoring plus plain-decoding requests per output token),
``drafted``/``accepted`` draft tokens, ``identical`` (the fraction of answers equal to the
pass-through one) and ``passed_through`` (verified requests the gateway passed through).
The stand-in and the gateway run in child processes; the client runs here.
``--round-trip-s``/``--token-s`` pin the gateway's cost model (``verify_round_trip_s``,
``verify_token_s``) instead of the self-test's measurement.

``--healthz`` then sends one greedy chat request with a 6 MB prompt through remote
verification while this process polls ``GET /healthz`` back to back, and reports the
polls' latency (``healthz_p50_ms``, ``healthz_p99_ms``, ``healthz_max_ms``; the goal is a
p99 under 10 ms), the big request's status, seconds and pass-through reason. The stand-in
reports its context (``max_model_len``) unless ``--unknown-context``: then the gateway
templates and tokenizes the whole prompt (on a worker thread) before it finds it too long.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import httpx

from benchmarks.harness import (
    MODEL,
    free_port,
    gateway,
    parse,
    pct,
    spawned,
    wait_port,
    workload,
    write_json,
)

SMOKE = ("--limit", "2", "--max-tokens", "16")
ENDPOINT = "standin"


HEALTHZ_PROMPT_BYTES = 6_000_000


def _serve_standin(port: int, reports_context: bool = True) -> None:
    import uvicorn

    from local_verifier.engine import Engine
    from tests.remote_standin import RemoteStandIn

    standin = RemoteStandIn(Engine(MODEL, "cpu", "float32"))
    standin.reports_context = reports_context
    uvicorn.run(standin.app, host="127.0.0.1", port=port, log_level="error", access_log=False)


def _config(url: str, round_trip_s: float | None, token_s: float | None) -> dict[str, Any]:
    endpoint = {
        "name": ENDPOINT,
        "kind": "sglang",
        "base_url": f"{url}/v1",
        "models": [MODEL],
        "verify": "remote",
        "tokenizer": MODEL,
        "verify_check_interval_s": 0,
        "timeout_s": 600,
        "verify_round_trip_s": round_trip_s,
        "verify_token_s": token_s,
    }
    return {"endpoints": [endpoint], "auth": False}


def _wait_self_test(client: httpx.Client, deadline_s: float = 600) -> dict[str, Any]:
    """The endpoint's self-test (state, agreement, measured costs), once there is one
    (polled: a benchmark's wait)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        record = client.get("/v1/endpoints").json()["data"][0]
        if record["remote_verify"] != "unknown":
            test = next(e for e in record["evidence"] if e["feature"] == "remote_verify")
            return {"state": record["remote_verify"], "detail": test["detail"], **test["values"]}
        time.sleep(0.5)
    raise RuntimeError("the remote-verify self-test did not finish")


def _ask(client: httpx.Client, body: dict[str, Any]) -> tuple[dict[str, Any], float, str]:
    t0 = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    return response.json(), seconds, response.headers.get("x-draftgate-prediction", "")


def _healthz_during_big_prompt(url: str) -> dict[str, Any]:
    """``/healthz`` latency while a 6 MB greedy prompt goes through remote verification."""
    line = "def add(a, b):\n    return a + b  # a line of a long file, naïve café\n"
    content = (line * (HEALTHZ_PROMPT_BYTES // len(line) + 1))[:HEALTHZ_PROMPT_BYTES]
    message = {"role": "user", "content": content}
    # encoded before the clock starts: encoding it here would hold this process's GIL
    # and delay the polls, not the gateway
    body = json.dumps(
        {"model": MODEL, "messages": [message], "temperature": 0, "max_tokens": 16}
    ).encode()
    outcome: dict[str, Any] = {}

    def big() -> None:
        t0 = time.perf_counter()
        response = httpx.post(
            f"{url}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=600,
        )
        outcome.update(
            status=response.status_code,
            seconds=round(time.perf_counter() - t0, 3),
            remote_verify=response.headers.get("x-draftgate-remote-verify", ""),
        )

    latencies: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        client.get("/healthz")  # the connection is open before the clock starts
        sender = threading.Thread(target=big)
        sender.start()
        while sender.is_alive():
            t0 = time.perf_counter()
            client.get("/healthz").raise_for_status()
            latencies.append(time.perf_counter() - t0)
        sender.join()
    return {
        "prompt_bytes": HEALTHZ_PROMPT_BYTES,
        "polls": len(latencies),
        "healthz_p50_ms": round(pct(latencies, 50) * 1000, 2),
        "healthz_p99_ms": round(pct(latencies, 99) * 1000, 2),
        "healthz_max_ms": round(max(latencies) * 1000, 2),
        "big_request": outcome,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    categories = [c for c in (args.categories or "").split(",") if c]
    items = workload(args.workload, categories, limit=args.limit)
    port = free_port()
    with spawned(_serve_standin, port, not args.unknown_context) as proc:
        wait_port(port, proc, deadline_s=600)
        with gateway(
            _config(f"http://127.0.0.1:{port}", args.round_trip_s, args.token_s)
        ) as served:
            client = httpx.Client(base_url=served.url, timeout=600)
            state = _wait_self_test(client)
            totals: dict[str, dict[str, float]] = {}
            for item in items:
                body: dict[str, Any] = {
                    "model": MODEL,
                    "messages": item.messages,
                    "temperature": 0,
                    "max_tokens": min(args.max_tokens, item.max_tokens or args.max_tokens),
                }
                plain, plain_s, _ = _ask(client, {**body, "draftgate": {"draft": False}})
                if item.prediction:
                    body["prediction"] = {"type": "content", "content": item.prediction}
                verified, verified_s, how = _ask(client, body)
                t = totals.setdefault(item.category, dict.fromkeys(_KEYS, 0.0))
                t["answers"] += 1
                t["plain_tokens"] += plain["usage"]["completion_tokens"]
                t["plain_s"] += plain_s
                t["tokens"] += verified["usage"]["completion_tokens"]
                t["seconds"] += verified_s
                t["identical"] += (
                    verified["choices"][0]["message"]["content"]
                    == plain["choices"][0]["message"]["content"]
                )
                extension = verified.get("draftgate") or {}
                if how != "verified-remotely":
                    t["passed_through"] += 1
                t["round_trips"] += (extension.get("remote") or {}).get("round_trips", 0)
                t["drafted"] += extension.get("drafted_tokens", 0)
                t["accepted"] += extension.get("accepted_tokens", 0)
            client.close()
            healthz = _healthz_during_big_prompt(served.url) if args.healthz else None
    categories = {
        name: {
            "remote_tok_s": round(t["tokens"] / t["seconds"], 2),
            "passthrough_tok_s": round(t["plain_tokens"] / t["plain_s"], 2),
            "round_trips_per_token": round(t["round_trips"] / max(t["tokens"], 1), 4),
            "drafted": int(t["drafted"]),
            "accepted": int(t["accepted"]),
            "identical": round(t["identical"] / t["answers"], 4),
            "passed_through": int(t["passed_through"]),
            "answers": int(t["answers"]),
        }
        for name, t in totals.items()
    }
    pinned = {"round_trip_s": args.round_trip_s, "token_s": args.token_s}
    result = {
        "self_test": state,
        "pinned_costs": pinned,
        "max_tokens": args.max_tokens,
        "categories": categories,
    }
    if healthz is not None:
        result["healthz_during_6mb_prompt"] = {
            "context_reported": not args.unknown_context,
            **healthz,
        }
    return result


_KEYS = (
    "answers",
    "plain_tokens",
    "plain_s",
    "tokens",
    "seconds",
    "identical",
    "passed_through",
    "round_trips",
    "drafted",
    "accepted",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default=None, help="a workload .jsonl (default: shipped)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="items, mixed across categories")
    parser.add_argument("--categories", default=None, help="comma-separated (default: all)")
    parser.add_argument("--json", required=True, help="where the result goes")
    parser.add_argument(
        "--round-trip-s", type=float, default=None, help="pin the gateway's round-trip cost"
    )
    parser.add_argument(
        "--token-s", type=float, default=None, help="pin the gateway's time per output token"
    )
    parser.add_argument(
        "--healthz", action="store_true", help="/healthz latency during a 6 MB prompt"
    )
    parser.add_argument(
        "--unknown-context",
        action="store_true",
        help="the stand-in does not report max_model_len (the prompt is tokenized)",
    )
    args = parse(parser, SMOKE, argv)
    result = run(args)
    write_json(args.json, result)
    for name, row in result["categories"].items():
        print(name, row)


if __name__ == "__main__":
    main()
