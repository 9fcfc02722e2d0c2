"""Document uploads and lookups on a shared Redis, before and after an adversarial corpus.

Two namespaces on one Redis: ``honest`` and ``attacked``. Each phase times
``--samples`` uploads (``Corpus.put`` of a new ``--doc-chars`` slice of the CPython standard
library) and as many lookups (``Corpus.select`` with a prompt quoting 600 characters of a
stored document, anchors computed included) in each namespace, p50 and p99 in ms.

Between the phases the ``attacked`` namespace receives the adversarial corpus, written
straight through the store with anchors of the attacker's choosing (stronger than any
text, whose anchors are keyed): ``--uploads`` documents whose 1,024 anchors all share their
top 16 bits (one bucket when anchors were kept in 65,536 buckets), then ``--uploads``
documents that all hold the same 1,024 anchors (every posting list at its cap). Each phase
also times ``--samples`` store lookups in ``attacked`` whose query is 512 of those shared
anchors (``crafted_lookup``: after the abuse, each reads a full posting list per anchor).
``after_over_before`` is each p50's ratio; the goal is at most 2.

Usage: ``python -m benchmarks.bench_corpus_abuse --json OUT
[--redis-url redis://127.0.0.1:6379/0] [--uploads 200] [--samples 50] [--smoke]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import parse, stdlib_slices, write_json
from lookup.corpus import Corpus, open_store
from lookup.corpus.store import DocumentStore, Limits, NewDocument

SMOKE = ("--uploads", "3", "--samples", "3", "--doc-chars", "2000")
NAMESPACES = ("honest", "attacked")


SHARED = np.unique(np.random.default_rng(1).integers(0, 1 << 48, 1024, dtype=np.uint64))


def _crafted(doc_id: str, found: np.ndarray) -> NewDocument:
    text = f"crafted {doc_id}"
    sha = doc_id.encode().hex().ljust(64, "0")[:64]
    return NewDocument(doc_id, text, sha, len(text), None, None, (), found)


async def _abuse(store: DocumentStore, limits: Limits, uploads: int) -> None:
    """The adversarial corpus in the ``attacked`` namespace (see the module docstring)."""
    rng = np.random.default_rng(0)
    bucket = np.uint64(0xABCD << 32)
    for i in range(uploads):
        low = np.unique(rng.integers(0, 1 << 32, 1024, dtype=np.uint64))
        doc = _crafted(f"bucket{i}", bucket | low)
        await store.put("attacked", doc, answer=False, limits=limits, now=time.time())
    for i in range(uploads):
        doc = _crafted(f"fill{i}", SHARED)
        await store.put("attacked", doc, answer=False, limits=limits, now=time.time())


def _summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": float(np.percentile(samples, 50)),
        "p99_ms": float(np.percentile(samples, 99)),
        "n": len(samples),
    }


async def _phase(corpus: Corpus, texts: list[str], start: int, samples: int) -> dict[str, Any]:
    """Upload and lookup times in each namespace; uploads use texts[start:start+samples]."""
    out: dict[str, Any] = {}
    for ns in NAMESPACES:
        put_ms, select_ms, found = [], [], 0
        for i in range(samples):
            text = texts[start + i]
            t0 = time.perf_counter()
            await corpus.put(ns, f"doc{start + i}", text)
            put_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            docs = await corpus.select(ns, prompt_text=f"Explain this:\n{text[:600]}")
            select_ms.append((time.perf_counter() - t0) * 1000)
            found += any(d.id == f"doc{start + i}" for d in docs)
        out[ns] = {
            "upload": _summary(put_ms),
            "lookup": _summary(select_ms),
            "lookup_found_own_document": found / samples,
        }
    crafted_ms = []
    for _ in range(samples):
        t0 = time.perf_counter()
        await corpus.store.select(
            "attacked",
            ids=[],
            names=[],
            recent=0,
            query=SHARED[:512],
            retrieve=corpus.retrieve_max_docs,
            max_docs=corpus.select_max_docs,
            max_bytes=corpus.select_max_bytes,
            limits=corpus.limits,
            now=time.time(),
        )
        crafted_ms.append((time.perf_counter() - t0) * 1000)
    out["attacked"]["crafted_lookup"] = _summary(crafted_ms)
    return out


async def run(url: str, uploads: int, samples: int, doc_chars: int) -> dict[str, Any]:
    prefix = f"dg-bench-abuse-{uuid.uuid4().hex[:8]}:"
    store = open_store(url, prefix=prefix, timeout_s=60.0)
    corpus = Corpus(store, max_ns_docs=1_000_000, max_ns_bytes=1 << 40)
    texts = stdlib_slices(doc_chars, 2 * samples)
    try:
        before = await _phase(corpus, texts, 0, samples)
        t0 = time.perf_counter()
        await _abuse(store, corpus.limits, uploads)
        abuse_s = time.perf_counter() - t0
        after = await _phase(corpus, texts, samples, samples)
    finally:
        await _delete(url, prefix)
        await store.aclose()
    timed = ("upload", "lookup", "crafted_lookup")
    ratios = {
        ns: {
            op: after[ns][op]["p50_ms"] / before[ns][op]["p50_ms"]
            for op in timed
            if op in after[ns]
        }
        for ns in NAMESPACES
    }
    return {
        "uploads_per_kind": uploads,
        "samples": samples,
        "doc_chars": doc_chars,
        "adversarial_upload_ms_mean": abuse_s * 1000 / (2 * uploads),
        "before": before,
        "after": after,
        "after_over_before": ratios,
        "within_2x": all(r <= 2.0 for row in ratios.values() for r in row.values()),
    }


async def _delete(url: str, prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            await client.delete(key)
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--uploads", type=int, default=200, help="adversarial uploads per kind")
    parser.add_argument("--samples", type=int, default=50, help="timed uploads and lookups")
    parser.add_argument("--doc-chars", type=int, default=8000, help="characters per upload")
    args = parse(parser, SMOKE, argv)
    result = asyncio.run(run(args.redis_url, args.uploads, args.samples, args.doc_chars))
    write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
