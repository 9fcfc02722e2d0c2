"""The bf16 target (bf16 weights and K/V, float32 activations on the CPU) against
transformers computing in fp32 on the same bf16-rounded weights and K/V, and where the bf16 target runs on the
bf16 kernels (a CPU with AMX-BF16 or AVX512-BF16, ``DRAFTGATE_AMX`` not 0) with every
linear layer's input rounded to bf16 too, and on such a CPU attention's queries rounded to
bf16: what the target is defined to compute on this machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.options import KernelOptions
from local_verifier.kernels.packing import layout_of
from local_verifier.loader import LoadedModel, load_model
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from local_verifier.testing.kv_cache import new_cache
from local_verifier.testing.reference import load_reference

pytestmark = pytest.mark.slow
LIBRARY, _ = load_library()
DOT_SCORES = LIBRARY is not None and LIBRARY.dg_bf16_kernels() != 0  # bf16 K/V's scores
AMX = DOT_SCORES and KernelOptions.from_env().amx


@pytest.fixture(scope="module")
def smollm2_bf16() -> Iterator[LoadedModel]:
    yield load_model("smollm2-135m", device="cpu", dtype="bf16", tune_threads=False)


@pytest.fixture(scope="module")
def hf_bf16_rounded() -> Iterator[Any]:
    yield load_reference(
        "smollm2-135m", torch.bfloat16, round_linear_inputs=AMX, round_queries=DOT_SCORES
    )


def test_bf16_target_stores_bf16_weights_and_bf16_kv(smollm2_bf16: LoadedModel) -> None:
    assert smollm2_bf16.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in smollm2_bf16.model.parameters())
    storage = new_cache(smollm2_bf16, 8).storage
    assert storage.k.dtype == storage.v.dtype == torch.bfloat16


@pytest.mark.parametrize("index", [0, 1])
def test_greedy_64_tokens_match_transformers_on_bf16_weights(
    smollm2_bf16: LoadedModel, hf_bf16_rounded: Any, workload_path: Path, index: int
) -> None:
    """Each greedy token is transformers' argmax after the same prefix (teacher forcing)."""
    rows = [json.loads(line) for line in workload_path.read_text().splitlines() if line.strip()]
    row = [r for r in rows if r["category"] == "code_edit"][index]
    tok = smollm2_bf16.tokenizer
    prompt = tok.encode(tok.apply_chat_template(row["messages"]))
    *_, result = generate_plain(smollm2_bf16, prompt, SamplingParams(), max_tokens=64)
    assert isinstance(result, PlainResult)
    assert layout_of(smollm2_bf16.model.head.weight) == ("amx" if AMX else "packed")
    ours = result.token_ids
    full = prompt + ours + ([min(tok.eos_ids)] if len(ours) < 64 else [])
    with torch.no_grad():
        logits = hf_bf16_rounded(torch.tensor([full[:-1]])).logits[0]
    assert logits[len(prompt) - 1 :].argmax(-1).tolist() == full[len(prompt) :]
