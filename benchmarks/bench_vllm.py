"""draftgate's drafts against a real vLLM server, beside vLLM's own speculation.

    python -m benchmarks.bench_vllm --env DIR --model DIR --json OUT [--smoke]
        [--categories code_edit] [--limit K] [--max-tokens 256] [--repeats 2]
        [--methods plain,draftgate,ngram,suffix,in-engine,in-engine-corpus]
        [--ks 8] [--in-engine-base suffix] [--interleave]

``DIR``s come from ``python -m benchmarks.vllm_server install``/``convert`` (vLLM's CPU
build in its own environment; SmolLM2-135M as float32); ``DRAFTGATE_VLLM_ENV`` and
``DRAFTGATE_VLLM_MODEL`` give them when the options do not. Every item is asked greedily, not
streamed, ``--repeats`` times in a row (the first time and again, so caches of the server
and of the proposers show), after one short warm-up request per server, of:

- ``plain``: vLLM without speculation, its OpenAI chat endpoint (the reference answer);
- ``draftgate``: the gateway in front of the same server with ``verify = "remote"`` (the
  item's prediction and the prompt drafted by the gateway, scored by vLLM's token-in
  endpoint), in a process of its own;
- ``ngram`` and ``suffix``: vLLM restarted with its own n-gram prompt lookup or suffix
  decoding (arctic-inference), ``k`` speculative tokens, draftgate's plugin not loaded;
- ``in-engine``: vLLM restarted with ``--in-engine-base`` (``ngram`` or ``suffix``) and
  draftgate's plugin (``integrations/vllm``), the gateway in front with
  ``verify = "in-engine"`` and answers captured: the gateway sends the prediction and the
  tenant's documents and earlier answers as token ids, vLLM verifies them in its own steps;
- ``in-engine-corpus``: the same server and gateway, the items asked without their
  prediction; before the first ask each item's prediction (for a code edit, the file it
  edits) is uploaded to the tenant's corpus under an id no request names, so the gateway's
  retrieval has to find it.

Each method with speculation runs once per ``--ks`` value (``ngram_k16``, ...), one server
after another; with ``--interleave``, per ``k`` all of them are started at once (about
4 GB of memory each) and each item is asked of each in turn, so a change in the
machine's load during the run falls on every method alike.

Per method and repeat: output tokens over wall seconds (``tok_s``), answers identical to
``plain``'s text, and 5xx answers; for vLLM's speculation (``ngram``, ``suffix`` and the
``in-engine`` methods) also its engine steps, the draft tokens it verified and accepted
(vLLM's ``/metrics`` counters read around each answer: counts the machine's load does
not change), and their means per step; for
``draftgate`` also its round trips per output token
and how many answers were verified remotely, for the ``in-engine`` methods how many
answers carried drafts (``X-Draftgate-Prediction: verified-in-engine``) and whether the
server's log showed the plugin at work. vLLM and the gateway each run in a process of
their own; the client runs here, one request at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks import vllm_server
from benchmarks.harness import free_port, gateway, machine, parse, steps, workload, write_json

SPECULATIVE: dict[str, dict[str, Any]] = {
    "ngram": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "suffix": {"method": "suffix"},
}
IN_ENGINE = ("in-engine", "in-engine-corpus")
PLUGIN_LINE = "draftgate_vllm: gateway drafts join"  # the plugin's first proposal, logged
COUNTERS = {
    "vllm:iteration_tokens_total_count": "steps",  # one observation per engine step
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}
"""vLLM's speculation counters (``/metrics``), under the names the rows give them."""
MODEL = vllm_server.SERVED_NAME
WARM_UP = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello."}],
    "temperature": 0,
    "max_tokens": 8,
}
SMOKE = (
    *("--limit", "1", "--max-tokens", "16", "--repeats", "1"),
    *("--methods", "plain,draftgate,in-engine"),
)


def speculative(method: str, k: int) -> str:
    """vLLM's ``--speculative-config`` for its ``method`` with ``k`` tokens."""
    return json.dumps({**SPECULATIVE[method], "num_speculative_tokens": k})


def _gateway_config(url: str, verify: str) -> dict[str, Any]:
    """The gateway in front of vLLM at ``url``: ``remote`` verification (self-tested at
    start only) or ``in-engine`` drafts (answers captured, as earlier answers to draft)."""
    endpoint: dict[str, Any] = {
        "name": "vllm",
        "kind": "vllm",
        "base_url": f"{url}/v1",
        "models": [MODEL],
        "verify": verify,
        "tokenizer": MODEL,
        "timeout_s": 600,
    }
    if verify == "remote":
        endpoint["verify_check_interval_s"] = 0
    return {"endpoints": [endpoint], "auth": False, "capture": verify == "in-engine"}


def _wait_self_test(client: httpx.Client, deadline_s: float = 600) -> dict[str, Any]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        record = client.get("/v1/endpoints").json()["data"][0]
        if record["remote_verify"] != "unknown":
            return {"state": record["remote_verify"], "record": record}
        time.sleep(0.5)  # the self-test runs in the gateway's process: polled
    raise RuntimeError("the remote-verify self-test did not finish")


def spec_counters(metrics: str) -> dict[str, int]:
    """vLLM's speculation counters in its Prometheus ``metrics`` text (summed over labels;
    0 where speculation is off)."""
    counts = dict.fromkeys(COUNTERS.values(), 0)
    for line in metrics.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in COUNTERS:
            counts[COUNTERS[name]] += int(float(line.rsplit(" ", 1)[-1]))
    return counts


def _ask(
    client: httpx.Client, body: dict[str, Any], vllm: httpx.Client | None = None
) -> dict[str, Any]:
    """One answer; with ``vllm`` (the server's own client) also vLLM's speculation
    counters over it (the client asks one request at a time)."""
    before = spec_counters(vllm.get("/metrics").text) if vllm is not None else None
    t0 = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    if response.status_code >= 500:
        return {"status": response.status_code, "seconds": seconds, "text": None, "tokens": 0}
    response.raise_for_status()
    payload = response.json()
    answer = {
        "status": response.status_code,
        "seconds": seconds,
        "text": payload["choices"][0]["message"]["content"],
        "tokens": payload["usage"]["completion_tokens"],
        "how": response.headers.get("x-draftgate-prediction", ""),
        "remote": (payload.get("draftgate") or {}).get("remote") or {},
    }
    if vllm is not None and before is not None:
        after = spec_counters(vllm.get("/metrics").text)
        answer["spec"] = {name: after[name] - before[name] for name in after}
    return answer


def _runs(
    client: httpx.Client, bodies: list[dict[str, Any]], label: str, repeats: int
) -> list[list[dict[str, Any]]]:
    """One short request first (a fresh server's and gateway's first-request costs, which
    no item should carry), then ``repeats`` runs of ``bodies``."""
    _ask(client, WARM_UP)
    return [[_ask(client, b) for b in steps(bodies, label)] for _ in range(repeats)]


def _bodies_and_documents(
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The items asked without their prediction, and the predictions as documents that
    no request names (``in-engine-corpus``)."""
    bodies, documents = [], []
    for n, body in enumerate(_bodies(args)):
        prediction = body.pop("prediction", None)
        if prediction:
            documents.append({"id": f"src/item{n}.txt", "text": prediction["content"]})
        bodies.append(body)
    return bodies, documents


def _bodies(args: argparse.Namespace) -> list[dict[str, Any]]:
    categories = [c for c in (args.categories or "").split(",") if c]
    bodies = []
    for item in workload(args.workload, categories, limit=args.limit):
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": item.messages,
            "temperature": 0,
            "max_tokens": min(args.max_tokens, item.max_tokens or args.max_tokens),
        }
        if item.prediction:
            body["prediction"] = {"type": "content", "content": item.prediction}
        bodies.append(body)
    return bodies


def _vllm_body(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "prediction"}


def _summary(answers: list[dict[str, Any]], reference: list[str | None]) -> dict[str, Any]:
    tokens = sum(a["tokens"] for a in answers)
    seconds = sum(a["seconds"] for a in answers)
    row: dict[str, Any] = {
        "answers": len(answers),
        "tok_s": round(tokens / seconds, 2) if seconds else None,
        "output_tokens": tokens,
        "identical": sum(a["text"] == r for a, r in zip(answers, reference, strict=True)),
        "server_errors": sum(a["status"] >= 500 for a in answers),
    }
    if all("spec" in a for a in answers):
        row.update(_spec_summary(answers, tokens))
    if any(a.get("how") == "verified-in-engine" for a in answers):
        row["with_drafts"] = sum(a.get("how") == "verified-in-engine" for a in answers)
    elif any("how" in a and a["how"] for a in answers):
        trips = sum(a.get("remote", {}).get("round_trips", 0) for a in answers)
        row["verified_remotely"] = sum(a.get("how") == "verified-remotely" for a in answers)
        row["round_trips_per_token"] = round(trips / max(tokens, 1), 4)
    return row


def _spec_summary(answers: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    """vLLM's engine steps for the answers (the prompt's included), the draft tokens it
    verified and accepted (tokens accepted past the answer's end, its ``max_tokens`` or
    end token, count too, though the answer drops them), and their means per step."""
    drafted = sum(a["spec"]["draft_tokens"] for a in answers)
    accepted = sum(a["spec"]["accepted_tokens"] for a in answers)
    model_steps = sum(a["spec"]["steps"] for a in answers)
    return {
        "steps": model_steps,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "drafted_per_step": round(drafted / max(model_steps, 1), 2),
        "tokens_per_step": round(tokens / max(model_steps, 1), 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    methods = [m for m in args.methods.split(",") if m]
    bodies = _bodies(args)
    log = Path(args.log) if args.log else None
    result: dict[str, Any] = {"machine": machine(), "max_tokens": args.max_tokens, "methods": {}}
    reference: list[str | None] = []
    with vllm_server.running(args.env, args.model, free_port(), log=log) as url:
        with httpx.Client(base_url=url, timeout=600) as vllm:
            result["vllm_version"] = vllm.get("/version").json().get("version")
            runs = _runs(vllm, [_vllm_body(b) for b in bodies], "plain vLLM", args.repeats)
        reference = [a["text"] for a in runs[0]]
        result["methods"]["plain"] = [_summary(r, reference) for r in runs]
        if "draftgate" in methods:
            with gateway(_gateway_config(url, "remote")) as served:
                client = httpx.Client(base_url=served.url, timeout=600)
                result["self_test"] = _wait_self_test(client)
                runs = _runs(client, bodies, "draftgate", args.repeats)
                client.close()
            result["methods"]["draftgate"] = [_summary(r, reference) for r in runs]
    speculating = [m for m in (*SPECULATIVE, *IN_ENGINE) if m in methods]
    if args.interleave:
        plan = [[(m, k) for m in speculating] for k in args.ks]
    else:
        plan = [[(m, k)] for m in speculating for k in args.ks]
    for group in plan:
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(_serving(args, m, k, log)) for m, k in group]
            for server in servers:
                _ask(server.client, WARM_UP)
            for server, runs in zip(servers, _asked(servers, args.repeats), strict=True):
                result["methods"][server.name] = [_summary(r, reference) for r in runs]
        for server in servers:
            if server.plugin_log is not None:
                plugin = PLUGIN_LINE in server.plugin_log.read_text(errors="replace")
                result.setdefault("plugin_logged", {})[server.name] = plugin
    return result


@dataclasses.dataclass
class _Server:
    """One speculating method's server, ready to ask."""

    name: str
    client: httpx.Client
    """What asks: vLLM itself, or the gateway in front of it."""
    vllm: httpx.Client
    """vLLM's own API (its ``/metrics``)."""
    bodies: list[dict[str, Any]]
    plugin_log: Path | None
    """The server's log, read for the plugin's line (in-engine methods)."""


@contextlib.contextmanager
def _serving(args: argparse.Namespace, method: str, k: int, log: Path | None) -> Iterator[_Server]:
    """vLLM with ``method`` at ``k`` speculative tokens (for the in-engine methods with
    draftgate's plugin over ``--in-engine-base``, the gateway in front, and for
    ``in-engine-corpus`` the predictions uploaded as the tenant's documents)."""
    name = f"{method}_k{k}"
    with contextlib.ExitStack() as stack:
        if method in SPECULATIVE:
            url = stack.enter_context(
                vllm_server.running(
                    args.env, args.model, free_port(), speculative=speculative(method, k), log=log
                )
            )
            vllm = stack.enter_context(httpx.Client(base_url=url, timeout=600))
            bodies = [_vllm_body(b) for b in _bodies(args)]
            yield _Server(name, vllm, vllm, bodies, None)
            return
        documents: list[dict[str, str]] = []
        bodies = _bodies(args)
        if method == "in-engine-corpus":
            bodies, documents = _bodies_and_documents(args)
        plugin_log = Path(args.json).with_suffix(f".{method}-k{k}.log")
        plugin_log.unlink(missing_ok=True)
        url = stack.enter_context(
            vllm_server.running(
                args.env,
                args.model,
                free_port(),
                speculative=speculative(args.in_engine_base, k),
                log=plugin_log,
                draftgate_plugin=True,
            )
        )
        served = stack.enter_context(gateway(_gateway_config(url, "in-engine")))
        client = stack.enter_context(httpx.Client(base_url=served.url, timeout=600))
        vllm = stack.enter_context(httpx.Client(base_url=url, timeout=60))
        for document in documents:
            client.post("/v1/documents", json=document).raise_for_status()
        yield _Server(name, client, vllm, bodies, plugin_log)


def _asked(servers: list[_Server], repeats: int) -> list[list[list[dict[str, Any]]]]:
    """Every server's answers, per repeat: each item asked of every server in turn (one
    server: its items in a row), so a change in the machine's load falls on all alike."""
    runs: list[list[list[dict[str, Any]]]] = [[[] for _ in range(repeats)] for _ in servers]
    label = " + ".join(s.name for s in servers)
    for repeat in range(repeats):
        for i in steps(range(len(servers[0].bodies)), label):
            for server, answers in zip(servers, runs, strict=True):
                answers[repeat].append(_ask(server.client, server.bodies[i], server.vllm))
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--env", type=Path, default=os.environ.get("DRAFTGATE_VLLM_ENV"), help="vLLM's venv"
    )
    parser.add_argument(
        "--model", type=Path, default=os.environ.get("DRAFTGATE_VLLM_MODEL"), help="HF dir"
    )
    parser.add_argument("--workload", default=None, help="a workload .jsonl (default: shipped)")
    parser.add_argument("--categories", default="code_edit")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--methods", default="plain,draftgate,ngram,suffix,in-engine,in-engine-corpus"
    )
    parser.add_argument(
        "--ks",
        type=lambda v: [int(k) for k in v.split(",")],
        default=[8],
        help="speculative tokens per step, one run per value (comma-separated)",
    )
    parser.add_argument(
        "--in-engine-base",
        choices=sorted(SPECULATIVE),
        default="suffix",
        help="vLLM's own method the in-engine drafts join",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="per k, every speculating method's server at once, each item asked of each in turn",
    )
    parser.add_argument("--log", default=None, help="append vLLM's output to this file")
    parser.add_argument("--json", required=True, help="where the result goes")
    args = parse(parser, SMOKE, argv)
    if args.env is None or args.model is None:
        parser.error("--env and --model (or DRAFTGATE_VLLM_ENV, DRAFTGATE_VLLM_MODEL) are needed")
    result = run(args)
    write_json(args.json, result)
    for method, rows in result["methods"].items():
        print(method, rows)


if __name__ == "__main__":
    main()
