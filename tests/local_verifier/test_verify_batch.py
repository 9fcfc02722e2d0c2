"""Greedy verification of a whole step on the logits' device: the verdicts are
``verify_greedy``'s, bitwise, on logits full of ties, for chains and trees (siblings with
equal tokens too), and a step copies its greedy verdicts to the host exactly once."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from arrivals import together
from spec_drafts import OracleDrafter, PassThrough
from test_batching import PROMPTS, Collector, alone, ids_of, make_engine
from torch.utils._python_dispatch import TorchDispatchMode

import local_verifier.step as step_module
import local_verifier.verify as verify_module
from local_verifier.engine import Engine, GenerationRequest
from local_verifier.loader import LoadedModel
from local_verifier.logits_processors import Penalties
from local_verifier.model import Transformer
from local_verifier.sampling import SamplingParams
from local_verifier.scheduler import Scheduler
from local_verifier.verify import Verdict, verify_greedy, verify_greedy_batch

V = 6  # few ids and few values: ties everywhere, drafts often accepted
SEEDS = range(40)


def _tied_rows(rng: np.random.Generator, n: int) -> torch.Tensor:
    """``[n, V]`` logits of small integers (several maxima per row), some rows with NaN
    (the largest for argmax) or all -inf."""
    rows = torch.from_numpy(rng.integers(0, 3, (n, V)).astype(np.float32))
    for row in rng.choice(n, size=n // 8, replace=False):
        rows[row, rng.integers(0, V, 2)] = float("nan")
    if n > 2:
        rows[rng.integers(0, n)] = float("-inf")
    return rows


def _draft(
    rng: np.random.Generator, rows: torch.Tensor, k: int, tree: bool
) -> tuple[list[int], list[int]]:
    """``k`` nodes whose tokens are mostly maxima of their parent's row (the first one or
    a later tied one; NaN the largest), with repeated sibling tokens in trees."""
    parents = [int(rng.integers(-1, n)) if tree else n - 1 for n in range(k)]
    tokens = []
    for parent in parents:
        row = rows[parent + 1]
        largest = row.isnan() if row.isnan().any() else row == row.max()
        maxima = torch.nonzero(largest).flatten().tolist()
        pick = rng.random()
        if pick < 0.5:
            tokens.append(maxima[0])
        elif pick < 0.8:
            tokens.append(maxima[-1])
        else:
            tokens.append(int(rng.integers(0, V)))
    return tokens, parents


def _cases(
    seed: int, requests: int, tree: bool
) -> tuple[list[torch.Tensor], list[tuple[list[int], list[int]]]]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 12, requests).tolist()
    flat = _tied_rows(rng, sum(k + 1 for k in sizes))
    parts = list(flat.split([k + 1 for k in sizes]))
    drafts = [_draft(rng, part, k, tree) for part, k in zip(parts, sizes, strict=True)]
    return parts, drafts


@pytest.mark.parametrize("tree", [False, True], ids=["chains", "trees"])
@pytest.mark.parametrize("seed", SEEDS)
def test_the_batch_verdicts_are_verify_greedys(seed: int, tree: bool) -> None:
    parts, drafts = _cases(seed, 1 + seed % 9, tree)
    want = [verify_greedy(p, t, q) for p, (t, q) in zip(parts, drafts, strict=True)]
    assert verify_greedy_batch(parts, drafts) == want  # views of one tensor
    copies = [p.clone() for p in parts]  # separate tensors: joined by a copy
    assert verify_greedy_batch(copies, drafts) == want
    some = list(range(0, len(parts), 2))[::-1]  # rows of others between them, out of order
    got = verify_greedy_batch([parts[i] for i in some], [drafts[i] for i in some])
    assert got == [want[i] for i in some]


@pytest.mark.parametrize("tree", [False, True], ids=["chains", "trees"])
def test_the_random_cases_reach_deep_paths_and_equal_siblings(tree: bool) -> None:
    deepest, equal_siblings = 0, 0
    for seed in SEEDS:
        parts, drafts = _cases(seed, 1 + seed % 9, tree)
        for part, (tokens, parents) in zip(parts, drafts, strict=True):
            deepest = max(deepest, len(verify_greedy(part, tokens, parents).accepted))
            equal_siblings += len(set(zip(parents, tokens, strict=True))) < len(tokens)
    assert deepest >= 4
    assert equal_siblings > 0 if tree else equal_siblings == 0


def test_a_later_tied_maximum_is_never_accepted() -> None:
    rows = torch.tensor(
        [[0.0, 2.0, 1.0, 2.0], [0.0] * 4, [5.0, 0.0, 0.0, 5.0], [0.0] * 4, [1.0, 0.0, 0.0, 3.0]]
    )
    # token 3 ties the first maximum at the root and below node 1: only 1, then 0, pass
    drafts = [([3, 1, 3, 0], [-1, -1, 1, 1])]
    assert verify_greedy(rows, *drafts[0]) == Verdict([1, 3], 3)
    assert verify_greedy_batch([rows], drafts) == [Verdict([1, 3], 3)]


def test_the_first_of_equal_siblings_is_followed() -> None:
    # nodes 0 and 1: the same token under the root; node 2 below node 1 only
    rows = torch.tensor([[0.0, 9.0, 0.0], [0.0, 0.0, 9.0], [9.0, 0.0, 0.0], [0.0, 0.0, 9.0]])
    drafts = [([1, 1, 0], [-1, -1, 1])]
    want = verify_greedy(rows, *drafts[0])
    assert want == Verdict([0], 2)
    assert verify_greedy_batch([rows], drafts) == [want]


def test_a_deep_chain_is_checked_along_its_whole_path() -> None:
    k = 100  # pointer jumping over seven doublings
    rows = torch.zeros(k + 1, V)
    tokens = [n % V for n in range(k)]
    for row, token in enumerate([*tokens, 4]):
        rows[row, token] = 1.0
    draft = (tokens, list(range(-1, k - 1)))
    assert verify_greedy_batch([rows], [draft]) == [Verdict(list(range(k)), 4)]
    tokens[20] = (tokens[20] + 1) % V  # more than 64 nodes above the draft's last
    want = Verdict(list(range(20)), 20 % V)
    assert verify_greedy(rows, tokens, draft[1]) == want
    assert verify_greedy_batch([rows], [(tokens, draft[1])]) == [want]


def test_step_logits_are_read_in_place() -> None:
    flat = torch.randn(9, V)
    parts = list(flat.split([2, 3, 4]))
    rows, starts = verify_module._joined_rows([parts[2], parts[0]])
    assert rows.data_ptr() == flat.data_ptr() and rows.shape == flat.shape
    assert starts == [5, 0]


class _ScalarReads(TorchDispatchMode):
    """Counts reads of one tensor element into a Python number (``.item()``, ``int()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_one_copy_and_no_scalar_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    parts, drafts = _cases(3, 8, tree=True)
    copies: list[torch.Tensor] = []
    real = verify_module._to_host

    def counted(values: torch.Tensor) -> list[list[int]]:
        copies.append(values)
        return real(values)

    monkeypatch.setattr(verify_module, "_to_host", counted)
    with _ScalarReads() as reads:
        verify_greedy_batch(parts, drafts)
    assert reads.count == 0
    assert len(copies) == 1 and copies[0].shape == (2, len(parts))


# -- the engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tiny_lm: LoadedModel) -> Engine:
    return make_engine(tiny_lm)


@pytest.fixture
def step_log(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Per scheduler step: (sequences given logits rows, ``_to_host`` copies), with the
    verdicts found as on a GPU."""
    log: list[tuple[int, int]] = []
    now = {"rows": 0, "copies": 0}
    real_step, real_forward = Scheduler.step, Transformer.step_chunked
    real_copy = verify_module._to_host

    def step(self: Scheduler) -> None:
        now.update(rows=0, copies=0)
        real_step(self)
        log.append((now["rows"], now["copies"]))

    def forward(self: Transformer, seqs: Any, kv: Any, max_rows: int) -> Any:
        out = real_forward(self, seqs, kv, max_rows)
        now["rows"] += sum(o.shape[0] > 0 for o in out)
        return out

    def copy(values: torch.Tensor) -> list[list[int]]:
        now["copies"] += 1
        return real_copy(values)

    monkeypatch.setattr(step_module, "_on_device", lambda device: True)  # the GPU's path
    monkeypatch.setattr(Scheduler, "step", step)
    monkeypatch.setattr(Transformer, "step_chunked", forward)
    monkeypatch.setattr(verify_module, "_to_host", copy)
    return log


def test_a_greedy_step_copies_its_verdicts_once(
    engine: Engine,
    tiny_lm: LoadedModel,
    step_log: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reqs = [GenerationRequest(prompt_ids=ids_of(tiny_lm, p), max_tokens=30) for p in PROMPTS]
    want = [alone(engine, GenerationRequest(**{**r.__dict__, "draft": False})) for r in reqs]
    host_reads: list[int] = []
    monkeypatch.setattr(step_module, "verify_greedy", lambda *a: host_reads.append(1))
    step_log.clear()
    got = [Collector() for _ in reqs + reqs]
    vocab = tiny_lm.config.vocab_size
    with together(engine):
        for n, (req, sink, expected) in enumerate(zip(reqs + reqs, got, want + want, strict=True)):
            tree = n >= len(reqs)
            drafter = OracleDrafter(expected, vocab, "tree" if tree else "partly", eos=2, seed=n)
            controller = PassThrough(k=6, width=3 if tree else 1)
            engine.submit(req, sink, drafter=drafter, controller=controller)
    assert engine.wait_idle(120)
    assert [c.ids for c in got] == want + want
    assert sum(c.stats.accepted_tokens for c in got) > 0
    assert host_reads == []
    assert all(copies == (rows > 0) for rows, copies in step_log), step_log
    assert max(rows for rows, _ in step_log) > 1  # steps verified several requests at once


def test_requests_adjusting_their_rows_take_the_host_path(
    engine: Engine, tiny_lm: LoadedModel, step_log: list[tuple[int, int]]
) -> None:
    ids = [ids_of(tiny_lm, p) for p in PROMPTS[:3]]
    reqs = [
        GenerationRequest(prompt_ids=ids[0], max_tokens=30),
        GenerationRequest(
            prompt_ids=ids[1], max_tokens=30, penalties=Penalties(repetition_penalty=1.3)
        ),
        GenerationRequest(
            prompt_ids=ids[2], max_tokens=30, params=SamplingParams(temperature=0.8, seed=1)
        ),
    ]
    want = [alone(engine, GenerationRequest(**{**r.__dict__, "draft": False})) for r in reqs]
    got = [Collector() for _ in reqs]
    with together(engine):
        for req, sink in zip(reqs, got, strict=True):
            engine.submit(req, sink)
    assert engine.wait_idle(120)
    assert [c.ids for c in got] == want
    assert all(copies <= 1 for _, copies in step_log)
    assert any(copies == 1 for _, copies in step_log)  # the plain greedy one's


def test_on_the_cpu_verdicts_read_only_the_accepted_rows(
    engine: Engine, tiny_lm: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[torch.Tensor] = []
    monkeypatch.setattr(verify_module, "_to_host", copies.append)
    req = GenerationRequest(prompt_ids=ids_of(tiny_lm, PROMPTS[0]), max_tokens=8)
    assert len(alone(engine, req)) == 8
    assert copies == []
