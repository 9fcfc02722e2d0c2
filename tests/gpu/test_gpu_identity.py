"""Greedy identity and bitwise batch invariance of the real model on CUDA, bf16 and float32
(marked ``cuda``, skipped where no CUDA device is; ``benchmarks/gpu_check.sh`` runs them).

The embedded default (SmolLM2-135M) decodes a few chat prompts greedily, one token per
step; then, with ``torch.equal``:
- ``chain``: the whole continuation verified as one chain equals the one-row steps;
- ``batched``: every prompt's chain in one forward pass equals each chain alone;
- ``chunked``: the prompt prefilled in chunks of 1, 7 and 64 tokens gives the K/V and the
  last row's logits of the prompt prefilled at once;
- ``reference`` (float32 only): transformers' argmax at each generated position equals the
  token emitted (a count: near-ties may differ on another device's kernels).
Then the step cost by row count as the engine measures it at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import SeqStep
from local_verifier.sampling import SamplingParams
from local_verifier.step_costs import measure_row_costs
from local_verifier.testing.generate import generate_plain

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [
    "Rename the variable x to count:\ndef f(x):\n    return x + 1\n",
    "Write a haiku about the sea.",
    "List three prime numbers greater than 100.",
    "Explain in two sentences what a hash map is.",
]
CHUNKS = (1, 7, 64)
COST_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_TOKENS = 48


def _arange(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n)


def _prefill(lm: LoadedModel, kv: KVStorage, ids: list[int], base: int, chunk: int) -> torch.Tensor:
    """``ids`` into slots ``base..``, ``chunk`` tokens per step; the last row's logits."""
    last = torch.empty(0)
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        step = SeqStep(
            torch.tensor(part),
            _arange(start, len(part)),
            _arange(base + start, len(part)),
            _arange(base, start),
            logits="last",
        )
        last = lm.model.step([step], kv)[0][-1]
    return last


def check(lm: LoadedModel, max_tokens: int, reference: Any) -> dict[str, Any]:
    tok = lm.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS
    ]
    outs = []
    for ids in prompts:
        *_, result = generate_plain(lm, ids, SamplingParams(), max_tokens=max_tokens)
        outs.append(list(result.token_ids))
    region = max(len(i) + len(o) for i, o in zip(prompts, outs, strict=True)) * 2 + 2
    kv = KVStorage(
        lm.config, region * len(prompts) * (2 + len(CHUNKS)), lm.device, lm.model.kv_dtype
    )
    chain_ok: list[bool] = []
    chunked_ok: list[bool] = []
    chains: list[SeqStep] = []
    alone: list[torch.Tensor] = []
    for p, (ids, out) in enumerate(zip(prompts, outs, strict=True)):
        base, n = p * region, len(ids)
        _prefill(lm, kv, ids, base, n)
        chain = SeqStep(
            torch.tensor(out), _arange(n, len(out)), _arange(base + n, len(out)), _arange(base, n)
        )
        rows = lm.model.step([chain], kv)[0]
        chains.append(chain)
        alone.append(rows)
        context = list(range(base, base + n))
        same = True
        for i, t in enumerate(out):  # one row per step, K/V in slots of their own
            slot = base + n + len(out) + i
            single = SeqStep(
                torch.tensor([t]),
                torch.tensor([n + i]),
                torch.tensor([slot]),
                torch.tensor(context),
            )
            same &= torch.equal(lm.model.step([single], kv)[0][0], rows[i])
            context.append(slot)
        chain_ok.append(same)
    together = lm.model.step(chains, kv)
    batched_ok = [torch.equal(a, b) for a, b in zip(alone, together, strict=True)]
    for p, ids in enumerate(prompts):
        runs = []
        for c, chunk in enumerate((*CHUNKS, len(ids))):
            base = (len(prompts) * (1 + c) + p) * region
            logits = _prefill(lm, kv, ids, base, chunk)
            slots = _arange(base, len(ids))
            runs.append((logits, kv.keys(slots), kv.v[:, slots.to(kv.v.device)]))
        whole = runs[-1]
        chunked_ok.append(
            all(all(torch.equal(a, b) for a, b in zip(r, whole, strict=True)) for r in runs)
        )
    result: dict[str, Any] = {
        "tokens": [len(o) for o in outs],
        "chain_equals_steps": chain_ok,
        "batched_equals_alone": batched_ok,
        "chunked_prefill_equal": chunked_ok,
    }
    if reference is not None:
        agree, total = 0, 0
        for ids, out in zip(prompts, outs, strict=True):
            with torch.no_grad():
                logits = reference(torch.tensor([ids + out[:-1]], device=lm.device)).logits[0]
            argmax = logits[len(ids) - 1 :].argmax(-1).tolist()
            agree += sum(a == b for a, b in zip(argmax, out, strict=True))
            total += len(out)
        result["reference_argmax_agree"] = f"{agree}/{total}"
    return result


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def cuda_model(request: pytest.FixtureRequest) -> LoadedModel:
    return load_model("smollm2-135m", device="cuda", dtype=request.param, max_seq_len=2048)


def test_real_model_is_bitwise_invariant_on_cuda(
    cuda_model: LoadedModel, record_property: Callable[[str, object], None]
) -> None:
    """Chain = steps, batched = alone, chunked = whole prefill, all ``torch.equal``; the
    reference agreement and the step costs are recorded (``--junitxml``), not asserted."""
    lm = cuda_model
    reference = None
    if lm.dtype == torch.float32:
        from local_verifier.testing.reference import load_reference

        reference = load_reference("smollm2-135m").to(lm.device)
    result = check(lm, MAX_TOKENS, reference)
    costs = measure_row_costs(lm, max(COST_ROWS))
    record_property("gpu", torch.cuda.get_device_name(lm.device))
    record_property("step_ms_by_rows", {r: round(costs[r] * 1e3, 3) for r in COST_ROWS})
    record_property("reference_argmax_agree", result.get("reference_argmax_agree"))
    assert all(result["chain_equals_steps"]), result
    assert all(result["batched_equals_alone"]), result
    assert all(result["chunked_prefill_equal"]), result
