"""Corpus behaviour through the public API, on every backend (memory, Redis, Redis Cluster)."""

from __future__ import annotations

import pytest

from lookup.corpus import Corpus, DocumentStore, DocumentTooLarge, InvalidDocument

PY = "def add(a, b):\n    return a + b\n"


async def test_put_then_get_returns_text_and_metadata(corpus: Corpus, clock) -> None:
    meta = await corpus.put("t", "src/pkg/math.py", PY, language="python")
    assert (meta.id, meta.bytes, meta.language) == ("src/pkg/math.py", len(PY), "python")
    assert meta.created == meta.last_used == clock.now
    clock.advance(5)
    doc = await corpus.get("t", "src/pkg/math.py")
    assert doc is not None
    assert doc.text == PY
    assert doc.sha256 == meta.sha256
    assert (doc.created, doc.last_used) == (meta.created, clock.now)


async def test_path_and_language_are_kept(corpus: Corpus) -> None:
    await corpus.put("t", "readme", "hello", path="docs/README.md")
    await corpus.put("t", "notes", "text", language="klingon")
    by_id = {m.id: m for m in await corpus.list("t")}
    # the corpus stores what it is given; guessing a language is the caller's job
    assert (by_id["readme"].path, by_id["readme"].language) == ("docs/README.md", None)
    assert by_id["notes"].language == "klingon"
    await corpus.put("t", "größe.py", "x = 1", path="src/größe.py", language="python")
    by_id = {m.id: m for m in await corpus.list("t")}
    for doc_id in ("readme", "notes", "größe.py"):  # selected: the same metadata as listed
        doc = await corpus.get("t", doc_id)
        assert doc is not None and doc.id == doc_id
        listed = by_id[doc_id]
        assert (doc.sha256, doc.bytes, doc.path, doc.language, doc.created) == (
            listed.sha256,
            listed.bytes,
            listed.path,
            listed.language,
            listed.created,
        )


async def test_missing_document_is_none_and_delete_reports_it(corpus: Corpus) -> None:
    assert await corpus.get("t", "nope") is None
    await corpus.put("t", "a", "x")
    assert await corpus.delete("t", "a") is True
    assert await corpus.delete("t", "a") is False
    assert await corpus.get("t", "a") is None
    assert await corpus.list("t") == []


async def test_list_is_most_recently_used_first(corpus: Corpus, clock) -> None:
    for name in ("a", "b", "c"):
        await corpus.put("t", name, f"text {name}")
        clock.advance(1)
    await corpus.get("t", "a")
    assert [m.id for m in await corpus.list("t")] == ["a", "c", "b"]


async def test_replacing_a_document_keeps_created_and_updates_text(corpus: Corpus, clock) -> None:
    first = await corpus.put("t", "a", "old")
    clock.advance(10)
    second = await corpus.put("t", "a", "new text")
    assert second.created == first.created
    assert second.last_used == clock.now
    doc = await corpus.get("t", "a")
    assert doc is not None and doc.text == "new text" and doc.bytes == 8
    assert len(await corpus.list("t")) == 1


async def test_count_cap_evicts_least_recently_used(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, max_ns_docs=3)
    for name in ("a", "b", "c"):
        await corpus.put("t", name, f"content of {name}")
        clock.advance(1)
    await corpus.get("t", "a")  # a is now more recent than b and c
    clock.advance(1)
    await corpus.put("t", "d", "content of d")
    assert sorted(m.id for m in await corpus.list("t")) == ["a", "c", "d"]


async def test_byte_cap_evicts_until_it_fits(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, max_doc_bytes=100, max_ns_bytes=250)
    for name in ("a", "b", "c"):
        await corpus.put("t", name, name * 100)
        clock.advance(1)
    assert sorted(m.id for m in await corpus.list("t")) == ["b", "c"]
    await corpus.put("t", "d", "d" * 10)
    assert sorted(m.id for m in await corpus.list("t")) == ["b", "c", "d"]


async def test_identical_content_is_stored_once(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, max_doc_bytes=100, max_ns_bytes=150)
    await corpus.put("t", "one", "x" * 100)
    await corpus.put("t", "two", "x" * 100)  # same content: no new bytes, nothing evicted
    assert sorted(m.id for m in await corpus.list("t")) == ["one", "two"]
    await corpus.delete("t", "one")
    doc = await corpus.get("t", "two")  # the shared content outlives one of its holders
    assert doc is not None and doc.text == "x" * 100
    await corpus.put("t", "three", "y" * 100)  # different content: over the cap, LRU goes
    assert [m.id for m in await corpus.list("t")] == ["three"]


async def test_documents_expire_after_ttl_without_use(store: DocumentStore, clock) -> None:
    corpus = Corpus(store, clock=clock, ttl_s=100)
    await corpus.put("t", "kept", "k")
    await corpus.put("t", "dropped", "d")
    clock.advance(60)
    assert await corpus.get("t", "kept") is not None  # use renews it
    clock.advance(60)
    assert await corpus.get("t", "dropped") is None
    assert [m.id for m in await corpus.list("t")] == ["kept"]
    clock.advance(101)
    assert await corpus.list("t") == []


async def test_default_ttl_is_a_day(corpus: Corpus, clock) -> None:
    await corpus.put("t", "a", "x")
    clock.advance(86400 - 1)
    assert [m.id for m in await corpus.list("t")] == ["a"]
    clock.advance(2)
    assert await corpus.list("t") == []


async def test_oversize_document_is_rejected_with_a_clear_error(store, clock) -> None:
    corpus = Corpus(store, clock=clock, max_doc_bytes=10)
    with pytest.raises(DocumentTooLarge, match="11 bytes; the limit is 10"):
        await corpus.put("t", "a", "é" * 5 + "x")
    assert await corpus.list("t") == []


@pytest.mark.parametrize("text", [b"\xff\xfe bad", b"ok \xc3", "lone \ud800 surrogate"])
async def test_invalid_utf8_is_rejected(corpus: Corpus, text: str | bytes) -> None:
    with pytest.raises(InvalidDocument, match="not valid UTF-8"):
        await corpus.put("t", "a", text)


async def test_utf8_bytes_are_accepted(corpus: Corpus) -> None:
    await corpus.put("t", "a", "naïve — ok".encode())
    doc = await corpus.get("t", "a")
    assert doc is not None and doc.text == "naïve — ok"


@pytest.mark.parametrize(
    ("ns", "doc_id", "path"),
    [("", "a", None), ("t", "", None), ("t", "x" * 1025, None), ("t\ud800", "a", None)]
    + [("t", "a\udfff", None), ("t", "a", "p\ud800.py")],
)
async def test_malformed_names_are_rejected(corpus: Corpus, ns: str, doc_id: str, path) -> None:
    with pytest.raises(InvalidDocument):
        await corpus.put(ns, doc_id, "text", path=path)
    with pytest.raises(InvalidDocument):
        await corpus.get(ns, doc_id if path is None else "a\udfff")


ODD_IDS = [
    "lru",
    "docs",
    "names",
    "b:" + "0" * 64,
    "}{dg:{x}:lru",
    "*?[a]",
    "line\nbreak\r\n",
    "nul\x00byte",
    "ünïcødé/文件.py",
    " ",
]


async def test_ids_and_namespaces_with_any_characters_round_trip(corpus: Corpus) -> None:
    namespaces = ["t", "{t}", "t}:lru", "*", "ns\nx"]
    for ns in namespaces:
        for doc_id in ODD_IDS:
            await corpus.put(ns, doc_id, f"{ns!r} {doc_id!r}")
    for ns in namespaces:
        assert sorted(m.id for m in await corpus.list(ns)) == sorted(ODD_IDS)
        for doc_id in ODD_IDS:
            doc = await corpus.get(ns, doc_id)
            assert doc is not None and doc.text == f"{ns!r} {doc_id!r}"


@pytest.mark.parametrize(
    ("path", "language"),
    [("p" * 1025, None), ("", None), (None, "l" * 65), (None, "")],
    ids=["long-path", "empty-path", "long-language", "empty-language"],
)
async def test_path_and_language_are_bounded(corpus: Corpus, path, language) -> None:
    with pytest.raises(InvalidDocument):
        await corpus.put("t", "a", "text", path=path, language=language)
    assert await corpus.list("t") == []


async def test_metadata_counts_toward_the_byte_cap(store: DocumentStore, clock) -> None:
    """Empty documents with long paths fill the namespace's byte cap like text does: each
    costs its id, path, language and names, even when their (empty) content is shared."""
    corpus = Corpus(store, clock=clock, max_doc_bytes=100, max_ns_bytes=10_000)
    for i in range(20):
        await corpus.put("t", f"d{i:02}", "", path="p/" * 500 + f"{i:02}.py")
        clock.advance(1)
    kept = sorted(m.id for m in await corpus.list("t"))
    # one document's metadata: id (3) + path (1003) + language (6) + names (3 + 1003 + 6)
    assert len(kept) == 10_000 // 2024
    assert kept == [f"d{i:02}" for i in range(20 - len(kept), 20)]
    for doc_id in kept:  # deleting gives the bytes back
        await corpus.delete("t", doc_id)
    await corpus.put("t", "big", "x" * 100, path="q/" * 500 + "big.py")
    assert [m.id for m in await corpus.list("t")] == ["big"]
