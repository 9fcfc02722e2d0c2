"""The Triton step (``TritonStack`` run through ``StepGraphs``): close to the model's own
step, and a row's logits and K/V bitwise the same whatever shares the step, however it is
padded to a bucket, however its prompt is chunked, in a tree or a chain. On CUDA the
bucket runs as a captured graph and must equal the eager run; elsewhere it runs eagerly."""

from __future__ import annotations

import pytest
import torch

from local_verifier.kernels.plan import AttentionPlan
from local_verifier.kernels.triton_stack import StepGraphs, TritonStack, buckets
from local_verifier.kv_storage import KVStorage
from local_verifier.model import ModelConfig, SeqStep, Transformer

CFG = ModelConfig(
    vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96,
    max_seq_len=64, qkv_bias=True,
)  # fmt: skip
PROMPT = torch.tensor([5, 17, 3, 88, 42, 9, 61, 23, 70, 11, 2, 30])


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer.from_config(CFG)


def _graphs(model: Transformer, device: torch.device, max_rows: int = 16) -> StepGraphs:
    m = model.to(device)
    kv = KVStorage(CFG, 128, device=device)
    return StepGraphs(TritonStack(m.stack_weights()), kv.k, kv.v, max_rows, CFG.max_seq_len)


def _run(
    graphs: StepGraphs, seqs: list[tuple[torch.Tensor, int, torch.Tensor, torch.Tensor | None]]
):
    """Each (tokens, first position, first slot... as slots, mask); context = slots 0..pos."""
    tokens, positions, slots, ctx, new, masks = [], [], [], [], [], []
    for toks, pos, new_slots, mask in seqs:
        tokens.append(toks)
        positions.append(
            torch.arange(pos, pos + len(toks)) if mask is None else pos + _depths(mask)
        )
        slots.append(new_slots)
        ctx.append(torch.arange(new_slots[0] - pos, new_slots[0]))
        new.append(new_slots)
        masks.append(mask)
    plan = AttentionPlan.build(ctx, new, masks)
    logits = graphs.run(torch.cat(tokens), torch.cat(positions), torch.cat(slots), plan)
    return list(logits.split([len(t) for t in tokens]))


def _depths(mask: torch.Tensor) -> torch.Tensor:
    return mask.sum(1).long() - 1


def test_logits_close_to_the_models_step(model: Transformer, device: torch.device):
    graphs = _graphs(model, device)
    ours = _run(graphs, [(PROMPT, 0, torch.arange(12), None)])[0]
    kv = KVStorage(CFG, 128)
    cpu = model.to("cpu")
    ref = cpu.step([SeqStep(PROMPT, torch.arange(12), torch.arange(12), torch.arange(0))], kv)[0]
    assert float((ours.cpu() - ref).abs().max()) < 1e-4


def test_a_sequence_alone_batched_and_padded_is_the_same(model: Transformer, device: torch.device):
    alone = _run(_graphs(model, device), [(PROMPT[:3], 0, torch.arange(3), None)])[0]  # bucket 4
    with_one = _run(
        _graphs(model, device),
        [(PROMPT[:3], 0, torch.arange(3), None), (PROMPT[5:6], 0, torch.tensor([40]), None)],
    )[0]  # bucket 4, no padding
    with_many = _run(
        _graphs(model, device),
        [(PROMPT[5:11], 0, torch.arange(40, 46), None), (PROMPT[:3], 0, torch.arange(3), None)],
    )[1]  # bucket 16
    assert torch.equal(alone, with_one)
    assert torch.equal(alone, with_many)


def test_past_the_largest_bucket_runs_eagerly_with_the_same_bits(
    model: Transformer, device: torch.device
):
    small = _graphs(model, device, max_rows=4)
    assert small.bucket(12) is None
    big = _run(small, [(PROMPT, 0, torch.arange(12), None)])[0]
    assert torch.equal(big, _run(_graphs(model, device), [(PROMPT, 0, torch.arange(12), None)])[0])


def test_a_chunked_prompt_equals_one_pass(model: Transformer, device: torch.device):
    whole = _graphs(model, device)
    one = _run(whole, [(PROMPT, 0, torch.arange(12), None)])[0]
    chunked = _graphs(model, device)
    first = _run(chunked, [(PROMPT[:5], 0, torch.arange(5), None)])[0]
    second = _run(chunked, [(PROMPT[5:], 5, torch.arange(5, 12), None)])[0]
    assert torch.equal(torch.cat([first, second]), one)
    assert torch.equal(chunked.k[:, :1], whole.k[:, :1]) and torch.equal(
        chunked.v[:, :12], whole.v[:, :12]
    )


def test_a_tree_row_equals_the_same_row_in_a_chain(model: Transformer, device: torch.device):
    prefix = _graphs(model, device)
    _run(prefix, [(PROMPT[:6], 0, torch.arange(6), None)])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # row 2 off row 0
    drafts = torch.tensor([7, 8, 9])
    in_tree = _run(prefix, [(drafts, 6, torch.arange(6, 9), tree)])[0]
    chain = _graphs(model, device)
    _run(chain, [(PROMPT[:6], 0, torch.arange(6), None)])
    as_chain = _run(chain, [(drafts[[0, 2]], 6, torch.tensor([6, 8]), None)])[0]
    assert torch.equal(in_tree[0], as_chain[0]) and torch.equal(in_tree[2], as_chain[1])


def test_buckets_are_powers_of_two_up_to_the_budget():
    assert buckets(1) == [1]
    assert buckets(20) == [1, 2, 4, 8, 16, 32]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_eager_in_every_bucket(model: Transformer):
    device = torch.device("cuda")
    for rows in buckets(16):
        seq = [(torch.arange(rows) % CFG.vocab_size, 0, torch.arange(rows), None)]
        graphed = _graphs(model, device)
        eager = _graphs(model, device)
        eager.capture = False
        assert torch.equal(_run(graphed, seq)[0], _run(eager, seq)[0])
        assert torch.equal(graphed.k, eager.k) and torch.equal(graphed.v, eager.v)
