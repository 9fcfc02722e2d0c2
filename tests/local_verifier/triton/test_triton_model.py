"""``Transformer.step`` on the Triton backend: the Llama family through the bucketed step
(``StepGraphs``), close to the C++/torch kernels and bitwise the same for a sequence alone
or batched; a family outside the fused step (q/k norms) op by op through ``TritonOps``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from local_verifier.kernels.options import KernelOptions
from local_verifier.kv_storage import KVStorage
from local_verifier.model import ModelConfig, SeqStep, Transformer

CFG = ModelConfig(
    vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96,
    max_seq_len=64,
)  # fmt: skip
PROMPT = torch.tensor([5, 17, 3, 88, 42, 9, 61, 23])
OTHER = torch.tensor([1, 2, 3, 4, 5])


def _model(cfg: ModelConfig, device: torch.device, backend: str) -> Transformer:
    model = Transformer.from_config(cfg).to(device)
    model.kernel_options = KernelOptions(backend=backend)  # type: ignore[arg-type]
    return model


def _prefill(
    model: Transformer, device: torch.device, *prompts: torch.Tensor
) -> list[torch.Tensor]:
    kv = KVStorage(model.config, 128, device=device, dtype=model.kv_dtype)
    seqs, offset = [], 0
    for p in prompts:
        n = len(p)
        seqs.append(SeqStep(p, torch.arange(n), torch.arange(offset, offset + n), torch.arange(0)))
        offset += 32
    return model.step(seqs, kv)


@pytest.mark.parametrize("family", ["llama", "qk_norm"])
def test_triton_step_is_close_and_batch_invariant(device: torch.device, family: str):
    cfg = CFG if family == "llama" else replace(CFG, qk_norm=True)
    triton = _model(cfg, device, "triton")
    if family == "llama":
        assert triton._triton_graphs(_ops(triton), KVStorage(cfg, 16, device=device)) is not None
    alone = _prefill(triton, device, PROMPT)[0]
    batched = _prefill(triton, device, OTHER, PROMPT)[1]
    assert torch.equal(alone, batched)
    ref = _prefill(_model(cfg, torch.device("cpu"), ""), torch.device("cpu"), PROMPT)[0]
    assert float((alone.cpu() - ref).abs().max()) < 1e-4


def _ops(model: Transformer):
    from local_verifier.kernels import step_ops

    return step_ops(model.device, model.dtype, model.kernel_options.backend)
