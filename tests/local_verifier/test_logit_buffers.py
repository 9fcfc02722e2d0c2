"""A step's logits over reused mappings: a mapping is handed out again only once nothing
holds a tensor over it, and the logits a caller keeps are never written by later steps."""

from __future__ import annotations

import torch

from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.logit_buffers import LogitBuffers
from tests.local_verifier.test_step_logits import chunk_steps


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_mapping_is_reused_once_nothing_holds_it() -> None:
    pool = LogitBuffers(vocab=100, max_rows=8)
    first = pool.empty(8)
    at = _address(first)
    del first
    assert _address(pool.empty(3)) == at  # dropped: the same mapping again
    held = pool.empty(4)[1:3]  # a view keeps its mapping
    assert _address(held) == at
    other = pool.empty(4)
    assert _address(other) != at
    other.fill_(1.0)
    held.fill_(2.0)
    assert bool((other == 1.0).all())
    third = pool.empty(2)  # both mappings held: torch's allocator
    assert _address(third) not in (at, _address(other))
    assert pool.empty(9).shape == (9, 100)  # more rows than a mapping holds
    assert pool.empty(0).shape == (0, 100)


def test_kept_logits_are_not_overwritten_by_later_steps(tiny_lm: LoadedModel) -> None:
    model = tiny_lm.model
    assert model.fused_stack() is not None
    kv = KVStorage(tiny_lm.config, 64, dtype=model.kv_dtype)
    seqs = chunk_steps(tiny_lm.config.vocab_size, rows=[3, 2])
    kept = model.step(seqs, kv)
    copies = [t.clone() for t in kept]
    for rows in ([1], [4, 4], [2]):  # later steps of other sizes
        model.step(chunk_steps(tiny_lm.config.vocab_size, rows=rows), kv)
    assert all(torch.equal(a, b) for a, b in zip(kept, copies, strict=True))
    address = _address(model.step(seqs, kv)[0])
    assert _address(model.step(seqs, kv)[0]) == address  # a dropped step's memory reused
