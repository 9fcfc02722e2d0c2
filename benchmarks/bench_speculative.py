"""Speculative decoding vs plain decoding, ours and transformers', on a workload file.

    python -m benchmarks.bench_speculative --max-tokens 256 --json spec.json [--workload PATH] [--smoke]

Per prompt, interleaved after a warm-up: our plain greedy decoding, our speculative
decoding (with the record's prediction and documents; in a series each answer becomes a
document for the next request), transformers plain ``generate`` and transformers prompt
lookup (``prompt_lookup_num_tokens=10``) on the same model read from the same GGUF, in a
process of its own (``harness.TransformersPeer``), so that the engine's figures are what a
user's engine, alone in its process, does.
tokens/s = output tokens / wall time of the whole generation call, prompt processing
included; prompt-processing time is reported apart.

``--recall`` runs the ``recall`` category instead: requests whose answers copy stored
documents or earlier answers that they do not name, each run plain, with the document
named, and with the document found by the corpus itself (``lookup.corpus.Corpus`` on
the in-memory store, among 1000 stdlib slices as distractors), interleaved:
``recall_doc`` are the workload's code edits without their prediction, the edited file
stored; ``recall_repeat`` are the workload's other single requests asked a second time
after all the others, their first answers captured (keyed by their prompts).

``--structured`` runs the ``structured`` category instead: the workload's ``json``
prompts with a JSON schema as ``response_format`` (the grammar masks every row), each run
on the engine without a grammar (``text``), with the grammar and no drafts (``plain``) and
with the grammar and drafts (``speculative``: in a series the earlier constrained answers
are the documents), interleaved; it reports tokens/s, the grammar's time per output token
and whether ``speculative`` equals ``plain`` token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.harness import (
    TransformersPeer,
    parse,
    stdlib_slices,
    steps,
    workload,
    write_json,
)
from gateway.audit.workload import WorkloadItem
from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.grammar import json_grammar
from local_verifier.loader import LoadedModel, load_model
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from lookup.corpus import Corpus, open_store
from lookup.draft import Source

SMOKE = ("--ids", "edit00", "--max-tokens", "8", "--threads", "1")

CONFIGS = ("plain", "speculative", "hf_plain", "hf_pld")


def document(lm: LoadedModel, text: str) -> tuple[str, np.ndarray]:
    key = hashlib.sha256(text.encode()).hexdigest()
    return key, np.asarray(lm.tokenizer.encode(text), dtype=np.uint32)


def run_plain(lm: LoadedModel, ids: list[int], limit: int) -> dict[str, Any]:
    begin = time.perf_counter()
    items = list(generate_plain(lm, ids, SamplingParams(), limit))
    wall = time.perf_counter() - begin
    result = items[-1]
    assert isinstance(result, PlainResult)
    text = "".join(i.text for i in items[:-1] if isinstance(i, TextDelta))
    return {
        "ids": result.token_ids,
        "text": text,
        "wall": wall,
        "prefill": result.prefill_s,
        "decode": result.decode_s,
    }


def run_speculative(engine: Engine, req: GenerationRequest) -> dict[str, Any]:
    begin = time.perf_counter()
    items = list(engine.generate(req))
    wall = time.perf_counter() - begin
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    deltas = [i for i in items[:-1] if isinstance(i, TextDelta)]
    return {
        "ids": [t for d in deltas for t in d.token_ids],
        "text": "".join(d.text for d in deltas),
        "wall": wall,
        "prefill": stats.prefill_s,
        "stats": stats,
    }


def run_hf(
    peer: TransformersPeer, ids: list[int], limit: int, eos: list[int], pld: bool
) -> dict[str, Any]:
    """transformers' greedy ``generate`` (with prompt lookup when ``pld``), in its process."""
    extra = {"prompt_lookup_num_tokens": 10} if pld else {}
    new, wall = peer.generate(
        ids, max_new_tokens=limit, do_sample=False, eos_token_id=eos, pad_token_id=eos[0], **extra
    )
    while new and new[-1] in eos:
        new.pop()
    return {"ids": new, "wall": wall}


def summarise(prompts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in prompts:
        groups[p["category"]].append(p)
        groups["all"].append(p)
    summary = {}
    for category, rows in groups.items():
        tps = {
            c: sum(r["tokens_by"][c] for r in rows) / sum(r["wall"][c] for r in rows)
            for c in CONFIGS
        }
        steps = sum(r["steps"] for r in rows)
        summary[category] = {
            "prompts": len(rows),
            "tps": tps,
            "speedup_vs_plain": tps["speculative"] / tps["plain"],
            "speedup_vs_hf_pld": tps["speculative"] / tps["hf_pld"],
            "hf_pld_vs_hf_plain": tps["hf_pld"] / tps["hf_plain"],
            "accepted_per_step": sum(r["accepted"] for r in rows) / max(steps, 1),
            "identical": sum(r["identical"] for r in rows) / len(rows),
        }
    return summary


RECALL_CONFIGS = ("plain", "named", "recall")
SOURCES = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}


def prompt_text(messages: list[dict[str, Any]]) -> str:
    """The prompt text the gateway selects documents with (``Call.prompt_text``)."""
    return "\n".join(str(m["content"]) for m in messages)


def distractors(count: int, chars: int = 2000) -> list[str]:
    """``count`` slices of the stdlib ``*.py`` text, as documents nobody asks about."""
    return stdlib_slices(chars, count)


def run_recall(
    lm: LoadedModel, engine: Engine, records: list[WorkloadItem], max_tokens: int
) -> dict[str, Any]:
    """The ``recall`` category (see the module docstring): rows and a summary per kind."""
    corpus = Corpus(open_store(None), max_ns_docs=100_000, max_ns_bytes=1 << 34)
    loop = asyncio.new_event_loop()
    ns = "recall"
    for i, text in enumerate(distractors(1000)):
        loop.run_until_complete(corpus.put(ns, f"stdlib/{i}.py", text))
    edits = [r for r in records if r.category == "code_edit" and r.prediction]
    singles = [r for r in records if r.category in ("chat", "json", "multilingual", "doc_qa")]
    for r in edits:
        loop.run_until_complete(corpus.put(ns, f"src/{r.id}.py", r.prediction))
    earlier: dict[str, str] = {}
    for r in singles:  # first asks: the answers are captured as the gateway does
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(r.messages))
        limit = min(max_tokens, r.max_tokens)
        first = run_speculative(engine, GenerationRequest(prompt_ids=ids, max_tokens=limit))
        earlier[r.id] = first["text"]
        text = prompt_text(r.messages)
        loop.run_until_complete(corpus.capture(ns, [first["text"]], request_texts=[text]))
        loop.run_until_complete(corpus.drain())
    rows = []
    jobs = [("recall_doc", r, r.prediction) for r in edits]
    jobs += [("recall_repeat", r, earlier[r.id]) for r in singles]
    for n, (kind, r, named_text) in enumerate(steps(jobs, "recall")):
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(r.messages))
        limit = min(max_tokens, r.max_tokens)
        docs = loop.run_until_complete(
            corpus.select(ns, prompt_text=prompt_text(r.messages), recent=2)
        )
        arrays = loop.run_until_complete(
            corpus.tokens(ns, docs, lm.tokenizer.fingerprint, lm.tokenizer.encode)
        )
        recall_req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=limit,
            documents=arrays,
            document_sources=[SOURCES[d.kind] for d in docs],
        )
        named_req = GenerationRequest(
            prompt_ids=ids, max_tokens=limit, documents=[document(lm, named_text)]
        )
        runs: dict[str, dict[str, Any]] = {}
        for config in RECALL_CONFIGS if n % 2 == 0 else RECALL_CONFIGS[::-1]:
            if config == "plain":
                runs[config] = run_plain(lm, ids, limit)
            else:
                runs[config] = run_speculative(
                    engine, named_req if config == "named" else recall_req
                )
        stats: GenerationStats = runs["recall"]["stats"]
        row = {
            "id": r.id,
            "category": kind,
            "tokens": len(runs["plain"]["ids"]),
            "wall": {c: runs[c]["wall"] for c in RECALL_CONFIGS},
            "tokens_by": {c: len(runs[c]["ids"]) for c in RECALL_CONFIGS},
            "selected": [(d.id, d.kind) for d in docs],
            "found": any(d.text == named_text for d in docs),
            "accepted_by_source": stats.accepted_by_source,
            "identical": all(
                runs[c]["ids"] == runs["plain"]["ids"] and runs[c]["text"] == runs["plain"]["text"]
                for c in ("named", "recall")
            ),
        }
        rows.append(row)
        w = row["wall"]
        print(
            f"{r.id:<16} {kind:<14} {row['tokens']:>4} tok  named x{w['plain'] / w['named']:.2f}"
            f"  recall x{w['plain'] / w['recall']:.2f}  found {row['found']}"
            f"  identical {row['identical']}",
            flush=True,
        )
    loop.close()
    summary = {}
    for kind in ("recall_doc", "recall_repeat"):
        group = [row for row in rows if row["category"] == kind]
        tps = {
            c: sum(x["tokens_by"][c] for x in group) / sum(x["wall"][c] for x in group)
            for c in RECALL_CONFIGS
        }
        summary[kind] = {
            "prompts": len(group),
            "tps": tps,
            "named_vs_plain": tps["named"] / tps["plain"],
            "recall_vs_plain": tps["recall"] / tps["plain"],
            "recall_share_of_named_speedup": (tps["recall"] / tps["plain"] - 1)
            / max(tps["named"] / tps["plain"] - 1, 1e-9),
            "found": sum(x["found"] for x in group) / len(group),
            "identical": sum(x["identical"] for x in group) / len(group),
        }
        print(kind, json.dumps(summary[kind]))
    return {"prompts": rows, "summary": summary}


STRUCTURED_CONFIGS = ("text", "plain", "speculative")
# the json prompts ask for an array of {package, version, license} objects
PACKAGES_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {k: {"type": "string"} for k in ("package", "version", "license")},
        "required": ["package", "version", "license"],
        "additionalProperties": False,
    },
}


def run_structured(
    lm: LoadedModel, engine: Engine, records: list[WorkloadItem], max_tokens: int
) -> dict[str, Any]:
    """The ``structured`` category (see the module docstring): rows and a summary."""
    grammar = json_grammar(PACKAGES_SCHEMA)
    series_docs: dict[str, list[str]] = defaultdict(list)
    rows = []
    for n, r in enumerate(steps([x for x in records if x.category == "json"], "structured")):
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(r.messages))
        limit = min(max_tokens, r.max_tokens)
        earlier = series_docs[r.series] if r.series else []
        follows = bool(earlier)
        reqs = {
            "text": GenerationRequest(prompt_ids=ids, max_tokens=limit, draft=False),
            "plain": GenerationRequest(
                prompt_ids=ids, max_tokens=limit, grammar=grammar, draft=False
            ),
            "speculative": GenerationRequest(
                prompt_ids=ids,
                max_tokens=limit,
                grammar=grammar,
                documents=[document(lm, d) for d in earlier],
                document_sources=[Source.ANSWER] * len(earlier),
            ),
        }
        order = STRUCTURED_CONFIGS if n % 2 == 0 else STRUCTURED_CONFIGS[::-1]
        runs = {c: run_speculative(engine, reqs[c]) for c in order}
        if r.series:
            earlier.append(runs["speculative"]["text"])
        stats = {c: runs[c]["stats"] for c in STRUCTURED_CONFIGS}
        row = {
            "id": r.id,
            "follows_earlier": follows,
            "tokens_by": {c: len(runs[c]["ids"]) for c in STRUCTURED_CONFIGS},
            "wall": {c: runs[c]["wall"] for c in STRUCTURED_CONFIGS},
            "grammar_s": {c: stats[c].grammar_s for c in STRUCTURED_CONFIGS},
            "steps": stats["speculative"].verify_steps,
            "accepted": stats["speculative"].accepted_tokens,
            "identical": runs["speculative"]["ids"] == runs["plain"]["ids"]
            and runs["speculative"]["text"] == runs["plain"]["text"],
            "valid_json": _parses(runs["plain"]["text"]),
        }
        rows.append(row)
        w, t = row["wall"], row["tokens_by"]
        print(
            f"{r.id:<10} {t['plain']:>4} tok  text {t['text'] / w['text']:6.1f}"
            f"  plain {t['plain'] / w['plain']:6.1f}  spec {t['speculative'] / w['speculative']:6.1f}"
            f"  grammar {1e6 * row['grammar_s']['plain'] / max(t['plain'], 1):6.0f} us/tok"
            f"  follows {row['follows_earlier']}  identical {row['identical']}",
            flush=True,
        )
    summary = {}
    for name, group in (
        ("all", rows),
        ("follows_earlier", [x for x in rows if x["follows_earlier"]]),
    ):
        if not group:
            continue
        tokens = {c: sum(x["tokens_by"][c] for x in group) for c in STRUCTURED_CONFIGS}
        tps = {c: tokens[c] / sum(x["wall"][c] for x in group) for c in STRUCTURED_CONFIGS}
        grammar_us = {
            c: 1e6 * sum(x["grammar_s"][c] for x in group) / max(tokens[c], 1)
            for c in ("plain", "speculative")
        }
        summary[name] = {
            "prompts": len(group),
            "tps": tps,
            "speculative_vs_plain": tps["speculative"] / tps["plain"],
            "plain_vs_text": tps["plain"] / tps["text"],
            "grammar_us_per_token": grammar_us,
            "accepted_per_step": sum(x["accepted"] for x in group)
            / max(sum(x["steps"] for x in group), 1),
            "identical": sum(x["identical"] for x in group) / len(group),
            "valid_json": sum(x["valid_json"] for x in group) / len(group),
        }
        print(name, json.dumps(summary[name]))
    return {"prompts": rows, "summary": summary}


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workload", type=Path, default=None, help="JSONL workload file (default: the shipped one)"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--ids", nargs="*", default=None, help="only these record ids")
    parser.add_argument("--recall", action="store_true", help="run the recall category only")
    parser.add_argument(
        "--structured", action="store_true", help="run the structured category only"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: measured and chosen at load)"
    )
    args = parse(parser, SMOKE)

    records = workload(args.workload)
    if args.ids:
        records = [r for r in records if r.id in set(args.ids)]
    lm = load_model(args.model, tune_threads=not args.threads)
    if args.threads:
        torch.set_num_threads(args.threads)
    # recall runs each prompt twice through the engine (named, then recall, or the reverse):
    # without prefix reuse both process it cold, as plain decoding does, and neither is
    # credited with the other's cached prompt
    engine = Engine(lm, prefix_cache=not args.recall)
    if args.recall or args.structured:
        warm = lm.tokenizer.encode(
            lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
        )
        run_plain(lm, warm, 8)
        run_speculative(engine, GenerationRequest(prompt_ids=warm, max_tokens=8))
        if args.structured:  # the grammar's tokenizer index is built once, here
            grammar = json_grammar(None)
            run_speculative(
                engine, GenerationRequest(prompt_ids=warm, max_tokens=8, grammar=grammar)
            )
            result = {"structured": run_structured(lm, engine, records, args.max_tokens)}
        else:
            result = {"recall": run_recall(lm, engine, records, args.max_tokens)}
        if args.json:
            write_json(args.json, result)
        return
    with TransformersPeer(args.model) as hf:
        result = compare(lm, engine, hf, records, args.max_tokens)
    if args.json:
        write_json(args.json, result)


def compare(
    lm: LoadedModel,
    engine: Engine,
    hf: TransformersPeer,
    records: list[WorkloadItem],
    max_tokens: int,
) -> dict[str, Any]:
    """Every record on the four ``CONFIGS`` (see the module docstring): rows and summary."""
    eos = sorted(lm.tokenizer.eos_ids)
    print(
        "step costs c(k)/c(0) at k=1,4,16,64: "
        + ", ".join(
            f"{engine.step_costs[k] / engine.step_costs[0]:.2f}"
            for k in (1, 4, 16, 64)
            if k < len(engine.step_costs)
        )
    )

    warm = lm.tokenizer.encode(
        lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    )
    run_plain(lm, warm, 8)
    run_speculative(engine, GenerationRequest(prompt_ids=warm, max_tokens=8))
    run_hf(hf, warm, 8, eos, pld=False)
    run_hf(hf, warm, 8, eos, pld=True)

    series_docs: dict[str, list[str]] = defaultdict(list)
    prompts = []
    for n, record in enumerate(steps(records, "records")):
        ids = lm.tokenizer.encode(lm.tokenizer.apply_chat_template(record.messages))
        limit = min(max_tokens, record.max_tokens)
        docs = [d["text"] for d in record.documents or []]
        docs += series_docs[record.series or ""] if record.series else []
        req = GenerationRequest(
            prompt_ids=ids,
            max_tokens=limit,
            prediction=record.prediction,
            documents=[document(lm, d) for d in docs],
        )
        runs: dict[str, dict[str, Any]] = {}
        order = CONFIGS if n % 2 == 0 else CONFIGS[::-1]  # alternate to spread drift
        for config in order:
            if config == "plain":
                runs[config] = run_plain(lm, ids, limit)
            elif config == "speculative":
                runs[config] = run_speculative(engine, req)
            else:
                runs[config] = run_hf(hf, ids, limit, eos, pld=config == "hf_pld")
        if record.series:
            series_docs[record.series].append(runs["speculative"]["text"])
        stats: GenerationStats = runs["speculative"]["stats"]
        tokens_by = {c: len(runs[c]["ids"]) for c in CONFIGS}
        wall = {c: runs[c]["wall"] for c in CONFIGS}
        row = {
            "id": record.id,
            "category": record.category,
            "tokens": tokens_by["plain"],
            "tps": {c: tokens_by[c] / wall[c] for c in CONFIGS},
            "prefill_s": {
                "plain": runs["plain"]["prefill"],
                "speculative": runs["speculative"]["prefill"],
                "hf": hf.forward_s(ids),
            },
            "steps": stats.verify_steps,
            "drafted": stats.drafted_tokens,
            "accepted": stats.accepted_tokens,
            "accepted_per_step": stats.accepted_tokens / max(stats.verify_steps, 1),
            "identical": runs["speculative"]["ids"] == runs["plain"]["ids"]
            and runs["speculative"]["text"] == runs["plain"]["text"],
            "hf_identical": runs["hf_plain"]["ids"] == runs["plain"]["ids"],
            "hf_pld_identical": runs["hf_pld"]["ids"] == runs["plain"]["ids"],
            "tokens_by": tokens_by,
            "wall": wall,
        }
        prompts.append(row)
        tps = row["tps"]
        print(
            f"{row['id']:<16} {row['category']:<12} {row['tokens']:>4} tok  "
            + "  ".join(f"{c} {tps[c]:6.1f}" for c in CONFIGS)
            + f"  x{tps['speculative'] / tps['plain']:.2f}  steps {row['steps']}"
            + f"  acc/step {row['accepted_per_step']:.2f}  identical {row['identical']}",
            flush=True,
        )

    summary = summarise(prompts)
    print(
        "\ncategory      n   plain   spec  hf_plain  hf_pld  spec/plain  spec/pld  acc/step  identical"
    )
    for category, s in summary.items():
        t = s["tps"]
        print(
            f"{category:<12} {s['prompts']:>2} {t['plain']:7.1f} {t['speculative']:6.1f} "
            f"{t['hf_plain']:8.1f} {t['hf_pld']:7.1f} {s['speedup_vs_plain']:10.2f} "
            f"{s['speedup_vs_hf_pld']:9.2f} {s['accepted_per_step']:9.2f} {s['identical']:9.0%}"
        )
    return {"prompts": prompts, "summary": summary}


if __name__ == "__main__":
    main()
