"""Selecting documents by content: rare shared n-grams, earlier answers, removal, isolation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lookup.corpus import Corpus, DocumentStore
from lookup.corpus.anchors import MAX_POSTINGS, AnchorConfig
from lookup.draft import Source
from lookup.drafter import Drafter
from lookup.index import TokenIndex

RARE = "quokka vellum 7731 zephyr : marmoset obelisk ( fjord )"
COMMON = "# Copyright the project authors . All rights reserved ."


def _filler(i: int) -> str:
    return f"{COMMON}\ndef helper_{i}(value):\n    return value * {i} + {i % 7}\n"


async def _put_many(corpus: Corpus, ns: str, texts: dict[str, str]) -> None:
    items = list(texts.items())
    for start in range(0, len(items), 8):
        await asyncio.gather(*(corpus.put(ns, i, t) for i, t in items[start : start + 8]))


# 10k puts: on one Redis and in memory (the cluster runs the same script; the smaller tests
# below cover it)
@pytest.mark.parametrize(
    "store", ["memory", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)
async def test_a_rare_8_gram_selects_its_document_among_10k(store: DocumentStore, clock) -> None:
    # window 1 indexes every 8-gram, so one shared 8-gram is enough
    corpus = Corpus(store, clock=clock, max_ns_docs=20_000, anchor_config=AnchorConfig(window=1))
    await _put_many(corpus, "t", {f"lib/f{i}.py": _filler(i) for i in range(10_000)})
    await corpus.put("t", "notes/target.txt", f"some notes\n{RARE}\nmore notes")
    prompt = f"{COMMON}\nWhat does this line mean: {RARE}?"
    docs = await corpus.select("t", prompt_text=prompt)
    assert docs[0].id == "notes/target.txt" and docs[0].kind == "retrieved"
    # the header all 10k share is too common to index for more than MAX_POSTINGS documents
    assert len(docs) <= 1 + MAX_POSTINGS
    assert await corpus.select("t", prompt_text=f"{COMMON}\nunrelated question") != []
    assert await corpus.select("t", prompt_text="nothing in common at all here") == []


async def test_a_shared_line_selects_its_document_by_default(corpus: Corpus) -> None:
    for i in range(50):
        await corpus.put("t", f"m{i}.py", _filler(i))
    line = "result = compute_totals(orders, discount=0.15, currency='EUR', rounding=True)"
    await corpus.put("t", "billing.py", f"import x\n\n{line}\nprint(result)\n")
    docs = await corpus.select("t", prompt_text=f"Fix the bug near `{line}` please")
    assert [d.id for d in docs] == ["billing.py"]


async def test_named_documents_come_before_retrieved_ones(corpus: Corpus) -> None:
    await corpus.put("t", "named.py", "x = 1")
    await corpus.put("t", "found.txt", f"intro\n{RARE}\n")
    docs = await corpus.select("t", ids=["named.py"], prompt_text=f"see {RARE} now")
    assert [(d.id, d.kind) for d in docs] == [("named.py", "named"), ("found.txt", "retrieved")]
    # a document both named and matched comes once, as named
    docs = await corpus.select("t", ids=["found.txt"], prompt_text=f"see {RARE} now")
    assert [(d.id, d.kind) for d in docs] == [("found.txt", "named")]


async def test_deletion_replacement_and_expiry_remove_a_document_from_selection(
    store: DocumentStore, clock
) -> None:
    corpus = Corpus(store, clock=clock, ttl_s=100)
    prompt = f"what is {RARE} about?"
    await corpus.put("t", "a.txt", f"first {RARE} last")
    assert [d.id for d in await corpus.select("t", prompt_text=prompt)] == ["a.txt"]
    await corpus.delete("t", "a.txt")
    assert await corpus.select("t", prompt_text=prompt) == []
    await corpus.put("t", "a.txt", f"first {RARE} last")
    await corpus.put("t", "a.txt", "replaced by text that shares nothing with the prompt at all")
    assert await corpus.select("t", prompt_text=prompt) == []
    await corpus.put("t", "b.txt", f"again {RARE} here")
    clock.advance(101)
    assert await corpus.select("t", prompt_text=prompt) == []
    await corpus.put("t", "c.txt", f"and {RARE} once more")
    assert [d.id for d in await corpus.select("t", prompt_text=prompt)] == ["c.txt"]


async def test_a_tenant_never_selects_another_tenants_document(corpus: Corpus) -> None:
    await corpus.put("alice", "secret.txt", f"alice knows {RARE} well")
    prompt = f"tell me about {RARE}"
    assert [d.id for d in await corpus.select("alice", prompt_text=prompt)] == ["secret.txt"]
    assert await corpus.select("bob", prompt_text=prompt) == []
    await corpus.put("bob", "mine.txt", f"bob also has {RARE} text")
    assert [d.id for d in await corpus.select("bob", prompt_text=prompt)] == ["mine.txt"]


async def test_the_index_counts_toward_the_byte_cap(store: DocumentStore, clock) -> None:
    text = " ".join(f"word{i}" for i in range(400))  # 2.7 KB, ~390 anchors at window 1
    corpus = Corpus(
        store,
        clock=clock,
        max_doc_bytes=4_000,
        max_ns_bytes=8_000,
        anchor_config=AnchorConfig(window=1),
    )
    for i in range(3):
        await corpus.put("t", f"d{i}", f"{i} {text}")
    # 3 x 2.7 KB of text fits in 8 KB, but not with ~5.5 KB of index per document
    assert [m.id for m in await corpus.list("t")] == ["d2"]


def _chat(question: str) -> str:
    return f"system: You are a helpful assistant.\nuser: {question}\nassistant:"


def _simulate(drafter: Drafter, answer: list[int]) -> tuple[dict[int, int], int, int]:
    """Greedy verification of ``answer`` with drafts of up to 32 tokens: accepted draft
    tokens per source, verify steps, and steps whose draft had a wrong token."""
    accepted: dict[int, int] = {}
    out = steps = wrong = 0
    while out < len(answer):
        draft = drafter.propose(32)
        n = 0
        while n < len(draft) and out + n < len(answer) and draft.tokens[n] == answer[out + n]:
            accepted[int(draft.source[n])] = accepted.get(int(draft.source[n]), 0) + 1
            n += 1
        wrong += n < len(draft) and out + n < len(answer)
        step = answer[out : out + n + 1]  # the accepted draft, then the target's own token
        drafter.extend(step)
        out += len(step)
        steps += 1
    return accepted, steps, wrong


async def test_a_repeated_question_drafts_its_whole_earlier_answer(corpus: Corpus) -> None:
    questions = [
        "How do I configure the cache of the service?",
        "Why does the build fail on Windows?",
        "What is the default port?",
        "How can I rotate the API keys?",
        "Which Python versions are supported?",
        "Where are the logs written?",
    ]
    answers = [
        "Open settings.toml, add a [cache] table with enabled = true and max_mb = 256, "
        "then restart the service so that it reads the new table.",
        "The build script calls make, which is missing there; install it with choco first.",
        "It listens on 8080 unless PORT is set in the environment.",
        "Create a new key, deploy it next to the old one, then revoke the old key.",
        "Python 3.10 to 3.13 are tested on every commit; older ones are not supported.",
        "Logs go to /var/log/service/current.log and rotate daily at midnight UTC.",
    ]
    for question, answer in zip(questions, answers, strict=True):
        await corpus.capture("t", [answer], request_texts=[_chat(question)])
        await corpus.drain()
    # the first question again, after five other requests, with recent=2
    docs = await corpus.select("t", prompt_text=_chat(questions[0]), recent=2)
    assert answers[0] in [d.text for d in docs]
    assert {d.kind for d in docs} == {"answer"}

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    arrays = await corpus.tokens("t", docs, "chars", encode)
    kinds = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}
    drafter = Drafter(
        encode(_chat(questions[0])),
        documents=[TokenIndex(np.asarray(tokens, np.int64)) for _, tokens in arrays],
        document_sources=[kinds[d.kind] for d in docs],
    )
    target = encode(answers[0])
    accepted, steps, wrong = _simulate(drafter, target)
    # every token is drafted from the earlier answer, except the target's own token of each
    # step; only the first two (before the answer's start is recognised) have no draft
    assert wrong == 0
    assert accepted == {Source.ANSWER: len(target) - steps}
    assert steps <= 2 + -(-len(target) // 33)
