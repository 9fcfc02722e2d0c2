"""Greedy verification on CUDA (marked ``cuda``; ``benchmarks/gpu_check.sh`` runs it): the
step's verdicts found on the device equal ``verify_greedy``'s on the same rows read on the
host, for chains and trees over float32 logits full of ties, with one copy to the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import local_verifier.verify as verify_module
from local_verifier.verify import verify_greedy, verify_greedy_batch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

V = 8


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_device_verdicts_equal_the_host_ones(tree: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    copies = []
    to_host = verify_module._to_host
    monkeypatch.setattr(verify_module, "_to_host", lambda t: copies.append(1) or to_host(t))
    for _ in range(20):
        logits, drafts = [], []
        for _ in range(int(rng.integers(1, 9))):
            k = int(rng.integers(0, 12))
            rows = torch.from_numpy(rng.integers(0, 3, (k + 1, V)).astype(np.float32))
            parents = [int(rng.integers(-1, n)) if tree else n - 1 for n in range(k)]
            tokens = [
                int(rows[p + 1].argmax()) if rng.random() < 0.8 else int(rng.integers(V))
                for p in parents
            ]
            logits.append(rows)  # the step's logits are float32
            drafts.append((tokens, parents))
        step = torch.cat(logits).cuda()  # one tensor, as a step's logits are
        views = list(step.split([len(x) for x in logits]))
        before = len(copies)
        got = verify_greedy_batch(views, drafts)
        assert len(copies) == before + 1
        for verdict, rows, (tokens, parents) in zip(got, logits, drafts, strict=True):
            want = verify_greedy(rows, tokens, parents)
            assert (verdict.accepted, verdict.next_token) == (want.accepted, want.next_token)
