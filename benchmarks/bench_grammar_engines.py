"""Which grammar engine should structured output use? Set-up, compile, per-token mask, fork
and rollback of each on SmolLM2's tokenizer.

    python -m benchmarks.bench_grammar_engines llguidance [--json out.json]
    python -m benchmarks.bench_grammar_engines xgrammar      # needs xgrammar installed
    python -m benchmarks.bench_grammar_engines outlines-core # needs outlines-core installed

How docs/structured-output.md chose the engine. One engine per process (import time and
peak memory are its own). A valid answer (the ``json`` workload's packages, 110 tokens)
is walked token by token through a matcher for a JSON schema and for any JSON object: at
each token the mask over the whole vocabulary is computed, then the token consumed. The
third walk is timed (the first two warm caches that live in the compiled grammar).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader

from benchmarks.harness import parse, write_json
from local_verifier.gguf_loader import read_tokenizer
from local_verifier.loader import smollm2_path

SCHEMA = {
    "type": "object",
    "properties": {
        "packages": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {k: {"type": "string"} for k in ("package", "version", "license")},
                "required": ["package", "version", "license"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["packages"],
    "additionalProperties": False,
}
ANSWER = {
    "packages": [
        {"package": "numpy", "version": "2.1.3", "license": "BSD-3-Clause"},
        {"package": "pydantic", "version": "2.10.3", "license": "MIT"},
        {"package": "rich", "version": "13.9.4", "license": "MIT"},
        {"package": "tqdm", "version": "4.67.1", "license": "MPL-2.0"},
    ]
}

Ops = dict[str, Callable[..., Any]]  # compile(kind), fill(m), accept(m, t), fork(m), rollback(m, n)


def llguidance_ops(tokenizer_json: str, vocab: int, eos: list[int], tokens: list[str]) -> Ops:
    from llguidance import LLMatcher, LLTokenizer

    lt = LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    mask = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def compile_(kind: str) -> Any:
        schema = SCHEMA if kind == "schema" else {"type": "object"}
        return LLMatcher(lt, LLMatcher.grammar_from_json_schema(schema))

    return {
        "compile": compile_,
        "fill": lambda m: m.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes),
        "accept": lambda m, t: m.consume_token(t),
        "fork": lambda m: m.deep_copy(),
        "rollback": lambda m, n: m.rollback(n),
    }


def xgrammar_ops(tokenizer_json: str, vocab: int, eos: list[int], tokens: list[str]) -> Ops:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(tokens, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab, stop_token_ids=eos)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    mask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)

    def compile_(kind: str) -> Any:
        grammar = compiler.compile_json_schema(
            json.dumps(SCHEMA if kind == "schema" else {"type": "object"})
        )
        return xgr.GrammarMatcher(grammar, max_rollback_tokens=200)

    return {
        "compile": compile_,
        "fill": lambda m: m.fill_next_token_bitmask(mask),
        "accept": lambda m, t: m.accept_token(t),
        "fork": lambda m: m.fork(),
        "rollback": lambda m, n: m.rollback(n),
    }


def outlines_core_ops(tokenizer_json: str, vocab: int, eos: list[int], tokens: list[str]) -> Ops:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    # byte-level BPE: each character of a token stands for one byte (GPT-2's table)
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = printable + [256 + i for i in range(256 - len(printable))]
    byte_of = {
        chr(c): b
        for b, c in zip(
            printable + [b for b in range(256) if b not in printable], chars, strict=True
        )
    }
    special = {t["id"] for t in json.loads(tokenizer_json).get("added_tokens", [])}
    mapping: dict[bytes, list[int]] = {}
    for i, token in enumerate(tokens):
        if i not in special and i not in eos:
            mapping.setdefault(bytes(byte_of[c] for c in token), []).append(i)
    vocabulary = oc.Vocabulary(eos[0], mapping)
    mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def compile_(kind: str) -> Any:  # a regex cannot recurse: any object is depth-bounded
        schema = SCHEMA if kind == "schema" else {"type": "object"}
        return oc.Guide(oc.Index(build_regex_from_schema(json.dumps(schema)), vocabulary))

    return {
        "compile": compile_,
        "fill": lambda m: m.write_mask_into(mask.data_ptr(), mask.numel(), 4),
        "accept": lambda m, t: m.advance(t),
        "fork": lambda m: copy.copy(m),
        "rollback": lambda m, n: m.rollback_state(n),
    }


ENGINES = {
    "llguidance": llguidance_ops,
    "xgrammar": xgrammar_ops,
    "outlines-core": outlines_core_ops,
}


def measure(ops: Ops, ids: list[int], kind: str) -> dict[str, float]:
    began = time.perf_counter()
    matcher = ops["compile"](kind)
    compile_s = time.perf_counter() - began
    masks: list[float] = []
    for walk in range(3):
        matcher = matcher if walk == 0 else ops["compile"](kind)
        for token in ids:
            a = time.perf_counter()
            ops["fill"](matcher)
            b = time.perf_counter()
            ops["accept"](matcher, token)
            if walk == 2:
                masks.append(b - a)
    matcher = ops["compile"](kind)
    for token in ids[:40]:
        ops["accept"](matcher, token)
    a = time.perf_counter()
    for _ in range(100):
        ops["fork"](matcher)
    fork_s = (time.perf_counter() - a) / 100
    for token in ids[40:48]:
        ops["accept"](matcher, token)
    a = time.perf_counter()
    ops["rollback"](matcher, 8)
    rollback_s = time.perf_counter() - a
    us = np.array(masks) * 1e6
    return {
        "compile_ms": compile_s * 1e3,
        "mask_us_mean": float(us.mean()),
        "mask_us_p50": float(np.median(us)),
        "mask_us_p90": float(np.percentile(us, 90)),
        "mask_us_max": float(us.max()),
        "fork_us": fork_s * 1e6,
        "rollback_8_us": rollback_s * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("--json", type=Path, default=None)
    args = parse(parser, ["llguidance"])  # one engine's walks take seconds
    reader = GGUFReader(str(smollm2_path()))
    tokenizer = read_tokenizer(reader)
    tokens = [str(t) for t in reader.fields["tokenizer.ggml.tokens"].contents()]
    vocab, eos = len(tokens), sorted(tokenizer.eos_ids)
    ids = tokenizer.encode(json.dumps(ANSWER))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    began = time.perf_counter()
    ops = ENGINES[args.engine](tokenizer.backend.to_str(), vocab, eos, tokens)
    result: dict[str, Any] = {
        "engine": args.engine,
        "tokens": len(ids),
        "setup_s": time.perf_counter() - began,  # import and tokenizer index
        "schema": measure(ops, ids, "schema"),
        "object": measure(ops, ids, "object"),
        "peak_rss_mb_added": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()
