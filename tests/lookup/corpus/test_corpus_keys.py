"""Key layout: one hash slot per namespace, nothing of a name in a key; cluster routing."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from lookup.corpus import Corpus, open_store
from lookup.corpus.keys import digest, digests, namespace_base

NAMESPACES = ["alice", "bob", "{carol}", "dave}{", "e:f", "ünï"]


async def _fill(corpus: Corpus) -> None:
    for ns in NAMESPACES:
        await corpus.put(ns, "src/x.py", f"x = {ns!r}", path="src/x.py")
        await corpus.put(ns, "secret id {not-a-tag}", "y")
        await corpus.capture(ns, [f"an answer for {ns}, long enough"])
        await corpus.drain()
        docs = await corpus.select(ns, prompt_text="x.py", recent=1)
        await corpus.tokens(ns, docs, "tokenizer", lambda s: [1, 2])


def test_packed_digests_are_the_digests_in_order() -> None:
    """A select sends names packed; they must hash as the names stored one by one."""
    names = ["a.py", "src/ünï.py", "", "x" * 2000, "\ud800lone"]
    assert digests(names) == "".join(digest(n) for n in names)
    assert digests([]) == ""


@pytest.mark.redis
async def test_each_namespace_keys_share_one_slot(redis_url, redis_prefix, redis_client) -> None:
    store = open_store(redis_url, prefix=redis_prefix, timeout_s=2.0)
    await _fill(Corpus(store))
    await store.aclose()
    keys = [k.decode() for k in redis_client.scan_iter(match=f"{redis_prefix}*")]
    for ns in NAMESPACES:
        base = namespace_base(redis_prefix, ns)
        mine = [k for k in keys if k.startswith(base)]
        assert {"lru", "ans", "docs", "names", "refs", "stat", "fps"} <= {
            k[len(base) :] for k in mine
        }
        assert any(k.startswith(base + "b:") for k in mine)
        assert any(k.startswith(base + "t:") for k in mine)
        assert {key_slot(k.encode()) for k in mine} == {key_slot(base.encode())}
    bases = tuple(namespace_base(redis_prefix, ns) for ns in NAMESPACES)
    assert all(k.startswith(bases) for k in keys)  # every key belongs to one namespace
    # no namespace, id or name text leaks into key names
    assert not any(s in k for k in keys for s in ("alice", "carol", "secret", "x.py"))


@pytest.mark.redis
async def test_namespaces_spread_over_cluster_nodes(redis_cluster_url, redis_prefix) -> None:
    store = open_store(redis_cluster_url, prefix=redis_prefix, timeout_s=2.0)
    corpus = Corpus(store)
    await _fill(corpus)
    client = store.client  # type: ignore[attr-defined]
    nodes = {
        client.get_node_from_key(namespace_base(redis_prefix, ns) + "lru").name for ns in NAMESPACES
    }
    assert len(nodes) >= 2  # the namespaces really live on different nodes
    for ns in NAMESPACES:
        docs = await corpus.select(ns, ids=["src/x.py"], recent=1)
        assert [d.text for d in docs] == [f"x = {ns!r}", f"an answer for {ns}, long enough"]
    await store.aclose()
