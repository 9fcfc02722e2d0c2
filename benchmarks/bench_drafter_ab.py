"""Proposal CPU time of this tree's drafter against another git ref's, side by side.

    python benchmarks/bench_drafter_ab.py --ref main --json OUT [--documents 1000]
        [--queries 60] [--widths 1,3] [--passes 5]

The ref's ``lookup`` package is extracted with ``git archive`` into a temporary directory
as ``lookup_ref`` and imported beside this tree's. One tenant stores ``--documents``
300-character stdlib slices (the in-memory store); each query quotes half of a random
document, the corpus selects up to 8 documents, and both drafters (over the same token
arrays) generate the rest of the quoted document in lockstep: each step times both
``propose`` calls (thread CPU time, alternating which goes first), compares the drafts
(they must be identical) and commits the same tokens (the accepted path plus one) to both.
Ratios from one process are what a busy machine can still measure; the absolute figures
need an idle one.

``--passes N`` adds N whole passes over the cases per drafter, the two alternating pass by
pass (fresh index caches and drafters each pass): every proposal then runs cold, after the
driver's own work as in ``bench_lookup.py``, and each proposal's minimum over the passes
is its cold cost without the neighbours' interference (``*_min_cpu_p99_us``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_lookup import greedy_step, load_tokenizer, stdlib_slices  # noqa: E402
from lookup.corpus import Corpus, open_store  # noqa: E402
from lookup.draft import Source  # noqa: E402
from lookup.drafter import Drafter  # noqa: E402
from lookup.index import IndexCache  # noqa: E402

KINDS = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}


def import_ref(ref: str, into: Path) -> Any:
    """The ``lookup`` package at ``ref`` as module ``lookup_ref`` (its imports renamed)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "lookup"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / "lookup_ref"
    (into / "lookup").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\blookup(?=\.| import)", "lookup_ref", text), encoding="utf-8")
    sys.path.insert(0, str(into))
    return tuple(importlib.import_module(f"lookup_ref.{m}") for m in ("drafter", "index", "draft"))


async def cases(documents: int, queries: int) -> list[tuple[list[int], list[Any], Any, list[int]]]:
    """(prompt ids, [(sha, tokens)], sources, target ids) per query whose document was found."""
    tokenizer = load_tokenizer()
    texts = stdlib_slices(300, documents)
    corpus = Corpus(open_store(None, prefix="ab:", timeout_s=5.0), max_ns_docs=documents)
    for start in range(0, documents, 64):
        part = texts[start : start + 64]
        await asyncio.gather(*(corpus.put("t", f"d{start + i}", t) for i, t in enumerate(part)))
    rng = np.random.default_rng(1)
    out = []
    for _ in range(queries):
        j = int(rng.integers(0, documents))
        prompt = f"What does this code do, and what comes after it?\n{texts[j][:150]}"
        docs = await corpus.select("t", prompt_text=prompt)
        if any(d.id == f"d{j}" for d in docs):
            arrays = await corpus.tokens("t", docs, "smollm2", tokenizer.encode)
            sources = [KINDS[d.kind] for d in docs]
            out.append(
                (tokenizer.encode(prompt), arrays, sources, tokenizer.encode(texts[j][150:]))
            )
    await corpus.aclose()
    return out


def lockstep(work: list[Any], ref: Any, width: int) -> dict[str, Any]:
    """Both drafters over every case; CPU µs per proposal and how many drafts were equal."""
    ref_drafter, ref_index, ref_draft = ref
    times: dict[str, list[float]] = {"ref": [], "this": []}
    caches = {"ref": ref_index.IndexCache(), "this": IndexCache()}
    steps = identical = 0
    for prompt, arrays, sources, target in work:
        drafters = {
            "ref": ref_drafter.Drafter(
                prompt,
                documents=[caches["ref"].get_or_build(s, t) for s, t in arrays],
                document_sources=[ref_draft.Source(int(s)) for s in sources],
            ),
            "this": Drafter(
                prompt,
                documents=[caches["this"].get_or_build(s, t) for s, t in arrays],
                document_sources=sources,
            ),
        }
        done = 0
        while done < len(target):
            drafts = {}
            for name in ("ref", "this") if steps % 2 else ("this", "ref"):
                start = time.thread_time_ns()
                drafts[name] = drafters[name].propose(16, width)
                times[name].append((time.thread_time_ns() - start) / 1e3)
            a, b = drafts["ref"], drafts["this"]
            identical += _same(a, b)
            steps += 1
            step = greedy_step(b, target, done)
            for d in drafters.values():
                d.extend(step)
            done += len(step)
    row: dict[str, Any] = {"width": width, "steps": steps, "identical": identical}
    for name, values in times.items():
        for q in (50, 90, 99):
            row[f"{name}_cpu_p{q}_us"] = float(np.percentile(values, q))
    for q in (50, 99):
        row[f"this_vs_ref_p{q}"] = row[f"this_cpu_p{q}_us"] / row[f"ref_cpu_p{q}_us"]
    return row


def _same(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in ("tokens", "parents", "scores", "source")
    )


def passes(work: list[Any], ref: Any, width: int, count: int) -> dict[str, Any]:
    """``count`` whole passes per drafter, alternating; CPU µs per proposal, each
    proposal's minimum over the passes, and how many drafts of the first passes were equal."""
    ref_drafter, ref_index, ref_draft = ref
    modules = {"ref": (ref_drafter.Drafter, ref_index.IndexCache), "this": (Drafter, IndexCache)}
    times: dict[str, list[list[float]]] = {"ref": [], "this": []}
    drafts: dict[str, list[Any]] = {}
    for i in range(count):
        for name in ("ref", "this") if i % 2 else ("this", "ref"):
            make, cache = modules[name][0], modules[name][1]()
            cpu: list[float] = []
            out: list[Any] = []
            for prompt, arrays, sources, target in work:
                kinds = [ref_draft.Source(int(s)) for s in sources] if name == "ref" else sources
                drafter = make(
                    prompt,
                    documents=[cache.get_or_build(s, t) for s, t in arrays],
                    document_sources=kinds,
                )
                done = 0
                while done < len(target):
                    start = time.thread_time_ns()
                    draft = drafter.propose(16, width)
                    cpu.append((time.thread_time_ns() - start) / 1e3)
                    out.append(draft)
                    step = greedy_step(draft, target, done)
                    drafter.extend(step)
                    done += len(step)
            times[name].append(cpu)
            drafts.setdefault(name, out)
    same = len(drafts["ref"]) == len(drafts["this"])
    row: dict[str, Any] = {
        "width": width,
        "passes": count,
        "steps": len(drafts["this"]),
        "identical": sum(map(_same, drafts["ref"], drafts["this"])) if same else 0,
    }
    for name, runs in times.items():
        per = np.asarray(runs)  # passes x proposals
        for q in (50, 99):
            row[f"{name}_cpu_p{q}_us"] = float(np.percentile(per, q))
            row[f"{name}_min_cpu_p{q}_us"] = float(np.percentile(per.min(axis=0), q))
        row[f"{name}_slow_every_pass"] = int((per.min(axis=0) > 40).sum())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--ref", default="main", help="the git ref to compare with")
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--widths", default="1,3", help="draft widths (1: chains)")
    parser.add_argument("--passes", type=int, default=0, help="whole passes per drafter")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_ref(args.ref, Path(tmp))
        work = asyncio.run(cases(args.documents, args.queries))
        widths = [int(w) for w in args.widths.split(",")]
        rows = [lockstep(work, ref, w) for w in widths]
        cold = [passes(work, ref, w, args.passes) for w in widths] if args.passes else []
    result = {"ref": args.ref, "cases": len(work), "rows": rows, "passes": cold}
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
