"""Bitwise batch invariance of ``Transformer.step``: a row's logits and K/V do not depend on
the other rows of its step, on how its draft is shaped, or on how its prompt was chunked.

Device and dtype come from ``DRAFTGATE_TEST_DEVICE`` (default cpu) and
``DRAFTGATE_TEST_DTYPE`` (default float32); every available kernel backend is checked, and
on the CPU also the bf16 target (bfloat16 weights, float32 activations) in the C++ kernels:
on CPUs with AMX-BF16 or AVX512-BF16, the tiny model's bf16 linear layers all run on the
bf16 kernels (AMX tiles or dot products).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.options import Backend, KernelOptions
from local_verifier.kernels.packing import layout_of
from local_verifier.kv_storage import KVStorage
from local_verifier.loader import LoadedModel
from local_verifier.model import SeqStep, Transformer
from tests.local_verifier.conftest import AMX_TINY_CFG

DEVICE = torch.device(os.environ.get("DRAFTGATE_TEST_DEVICE", "cpu"))
DTYPE = getattr(torch, os.environ.get("DRAFTGATE_TEST_DTYPE", "float32"))
LIBRARY, WHY = load_library()
CPP = DEVICE.type == "cpu" and torch.float32 == DTYPE and LIBRARY is not None
AMX = CPP and LIBRARY is not None and LIBRARY.dg_bf16_kernels() != 0
BACKENDS: list[Backend] = ["cpp", "torch"] if CPP else ["torch"]
# (kernel backend, weight dtype) pairs every invariance test runs on
CASES = [(b, DTYPE) for b in BACKENDS] + ([("cpp", torch.bfloat16)] if CPP else [])

CFG = AMX_TINY_CFG  # every bf16 linear weight AMX-packed where the CPU has AMX


@functools.cache
def _model(dtype: torch.dtype) -> Transformer:
    return Transformer.from_config(CFG, DEVICE, dtype)


@pytest.fixture(params=CASES, ids=lambda c: f"{c[0]}-{str(c[1]).removeprefix('torch.')}")
def tiny(request: pytest.FixtureRequest) -> Transformer:
    """The tiny model in the case's weight dtype, its backend set for the test."""
    backend, dtype = request.param
    model = _model(dtype)
    model.kernel_options = KernelOptions(backend=backend)
    return model


def _tokens(n: int, seed: int, vocab: int = CFG.vocab_size) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _rows(tokens: torch.Tensor, slots: list[int], context: list[int], **kw: object) -> SeqStep:
    n = len(context)
    return SeqStep(
        tokens=tokens,
        positions=torch.arange(n, n + len(tokens)),
        new_slots=torch.tensor(slots, dtype=torch.long),
        context_slots=torch.tensor(context, dtype=torch.long),
        **kw,  # type: ignore[arg-type]
    )


def _kv(model: Transformer, n_slots: int) -> KVStorage:
    return KVStorage(model.config, n_slots, DEVICE, model.kv_dtype)


def _sequential(
    model: Transformer, kv: KVStorage, tokens: torch.Tensor, start_slot: int, context: list[int]
) -> list[torch.Tensor]:
    """Logits of one-row steps over ``tokens``, each committed before the next."""
    context = list(context)
    out = []
    for i, token in enumerate(tokens.tolist()):
        slot = start_slot + i
        step = _rows(torch.tensor([token]), [slot], context)
        out.append(model.step([step], kv)[0][0])
        context.append(slot)
    return out


def test_chain_rows_equal_sequential_steps_for_every_length(tiny: Transformer) -> None:
    kv = _kv(tiny, 256)
    prompt = list(range(19))
    tiny.step([_rows(_tokens(19, 1), prompt, [])], kv)
    chain = _tokens(64, 2)
    sequential = _sequential(tiny, kv, chain, 100, prompt)
    seq_k, seq_v = kv.keys(torch.arange(100, 164)).clone(), kv.v[:, 100:164].clone()
    for k in range(1, 65):
        logits = tiny.step([_rows(chain[:k], list(range(180, 180 + k)), prompt)], kv)[0]
        for i in range(k):
            assert torch.equal(logits[i], sequential[i]), (k, i)
        assert torch.equal(kv.keys(torch.arange(180, 180 + k)), seq_k[:, :k]), k
        assert torch.equal(kv.v[:, 180 : 180 + k], seq_v[:, :k]), k


def test_tree_rows_equal_sequential_steps_along_their_paths(tiny: Transformer) -> None:
    gen = torch.Generator().manual_seed(3)
    n = 40
    parents = [-1] + [
        int(torch.randint(0, i, (1,), generator=gen)) if i > 1 else -1 for i in range(1, n)
    ]
    parents = [p if torch.rand(1, generator=gen) > 0.2 else -1 for p in parents]
    tokens = _tokens(n, 4)
    depth, mask = [0] * n, torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i, i] = True
        if p >= 0:
            mask[i] |= mask[p]
            depth[i] = depth[p] + 1
    kv = _kv(tiny, 400)
    prompt = list(range(45))
    tiny.step([_rows(_tokens(45, 5), prompt, [])], kv)
    tree = SeqStep(
        tokens=tokens,
        positions=torch.tensor([45 + d for d in depth]),
        new_slots=torch.arange(100, 100 + n),
        context_slots=torch.tensor(prompt),
        mask=mask,
    )
    logits = tiny.step([tree], kv)[0]
    for i in range(n):
        path = mask[i].nonzero().flatten()
        base = 200  # each path decoded one row at a time in slots 200...
        sequential = _sequential(tiny, kv, tokens[path], base, prompt)
        assert torch.equal(logits[i], sequential[-1]), i
        ours, theirs = torch.tensor([100 + i]), torch.tensor([base + len(path) - 1])
        assert torch.equal(kv.keys(ours), kv.keys(theirs)), i


def test_a_sequence_alone_equals_it_batched_with_others(tiny: Transformer) -> None:
    kv = _kv(tiny, 600)
    # the sequence of interest: 30 committed tokens, then a 5-row chain verify
    ours_ctx = list(range(30))
    tiny.step([_rows(_tokens(30, 6), ours_ctx, [])], kv)
    ours = _tokens(5, 7)
    alone = tiny.step([_rows(ours, [30, 31, 32, 33, 34], ours_ctx)], kv)[0]
    alone_k = kv.keys(torch.arange(30, 35)).clone()
    others = [
        lambda s: _rows(_tokens(13, 8), list(range(s, s + 13)), []),  # a prompt chunk
        lambda s: _rows(_tokens(1, 9), [s], list(range(40, 47))),  # a decode row
        lambda s: _rows(_tokens(3, 10), [s, s + 1, s + 2], [], logits="last"),
        lambda s: _rows(_tokens(64, 11), list(range(s, s + 64)), [], logits="none"),
        lambda s: _rows(_tokens(2, 12), [s, s + 1], list(range(40, 60))),
        lambda s: _rows(_tokens(7, 13), list(range(s, s + 7)), list(range(40, 44))),
        lambda s: _rows(_tokens(1, 14), [s], []),
    ]
    for n_others in range(1, 8):
        batch = [f(100 + 70 * j) for j, f in enumerate(others[:n_others])]
        where = n_others // 2
        batch.insert(where, _rows(ours, [35, 36, 37, 38, 39], ours_ctx))
        out = tiny.step(batch, kv)
        assert torch.equal(out[where], alone), n_others
        assert torch.equal(kv.keys(torch.arange(35, 40)), alone_k), n_others


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_prompt_chunks_give_the_same_kv_and_logits(tiny: Transformer, chunk: int) -> None:
    prompt = _tokens(150, 15)
    kv = _kv(tiny, 320)
    whole = tiny.step([_rows(prompt, list(range(150)), [], logits="last")], kv)[0]
    last = None
    for start in range(0, 150, chunk):
        piece = prompt[start : start + chunk]
        slots = list(range(160 + start, 160 + start + len(piece)))
        step = SeqStep(
            tokens=piece,
            positions=torch.arange(start, start + len(piece)),
            new_slots=torch.tensor(slots),
            context_slots=torch.arange(160, 160 + start),
            logits="last",
        )
        last = tiny.step([step], kv)[0]
    assert last is not None and torch.equal(last, whole)
    assert torch.equal(kv.keys(torch.arange(160, 310)), kv.keys(torch.arange(150)))
    assert torch.equal(kv.v[:, 160:310], kv.v[:, :150])


def test_backends_agree_with_each_other_closely() -> None:
    if len(BACKENDS) < 2:
        pytest.skip("one backend on this device")
    tiny = _model(DTYPE)
    outs = []
    for name in BACKENDS:
        tiny.kernel_options = KernelOptions(backend=name)
        kv = _kv(tiny, 64)
        outs.append(tiny.step([_rows(_tokens(40, 16), list(range(40)), [])], kv)[0])
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(not CPP, reason=f"no C++ kernels in this run: {WHY or f'{DEVICE}/{DTYPE}'}")
def test_bf16_target_is_the_float32_step_on_bf16_rounded_weights_and_kv() -> None:
    """Without bf16 kernels (``DRAFTGATE_AMX=0``, or a CPU without AMX or AVX512-BF16): the
    first layer's K/V (no attention before them) are the float32 step's rounded to bf16
    exactly; the later layers' read rounded K/V, so the logits are close, not equal."""
    bf16 = _model(torch.bfloat16)
    bf16.kernel_options = KernelOptions(amx=False)
    rounded = Transformer.from_config(CFG, DEVICE, torch.float32)
    rounded.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})
    assert bf16.weight_dtype == torch.bfloat16 and bf16.dtype == torch.float32
    pairs = zip(_model(DTYPE).parameters(), rounded.parameters(), strict=True)
    assert any(not torch.equal(p, q) for p, q in pairs)  # the rounding changed weights
    outs = []
    for model, kv_dtype in ((bf16, torch.bfloat16), (rounded, torch.float32)):
        kv = _kv(model, 64)
        assert kv.k.dtype == kv.v.dtype == kv_dtype
        prompt = _rows(_tokens(40, 20), list(range(40)), [])
        decode = _rows(_tokens(1, 21), [50], list(range(30)))
        outs.append((model.step([prompt, decode], kv), kv))
    (a, kv_a), (b, kv_b) = outs
    for ours, theirs in ((kv_a.k, kv_b.k), (kv_a.v, kv_b.v)):
        assert torch.equal(ours[0], theirs[0].to(torch.bfloat16))
        assert not torch.equal(ours[1:].float(), theirs[1:])
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=0.05, rtol=0.05)


@pytest.mark.skipif(not AMX, reason="no bf16 kernels here (AMX-BF16 or AVX512-BF16)")
def test_bf16_target_on_amx_takes_the_amx_kernels_and_is_close_to_the_fp32_ones() -> None:
    """Linear inputs rounded to bf16: close to, not bitwise, the float32 kernels' step."""
    bf16, outs = _model(torch.bfloat16), []
    for amx in (True, False):
        bf16.kernel_options = KernelOptions(backend="cpp", amx=amx)
        kv = _kv(bf16, 64)
        outs.append(bf16.step([_rows(_tokens(40, 20), list(range(40)), [])], kv)[0])
        assert layout_of(bf16.head.weight) == ("amx" if amx else "packed")
    assert not torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[1], atol=0.05, rtol=0.05)


@pytest.mark.slow
def test_smollm2_verify_and_batch_are_invariant(smollm2: LoadedModel) -> None:
    model = smollm2.model
    kv = KVStorage(smollm2.config, 256, model.device, model.kv_dtype)
    vocab = smollm2.config.vocab_size
    prompt = list(range(40))
    model.step([_rows(_tokens(40, 17, vocab), prompt, [])], kv)
    chain = _tokens(16, 18, vocab)
    sequential = _sequential(model, kv, chain, 60, prompt)
    other = _rows(_tokens(30, 19, vocab), list(range(100, 130)), [])
    verify = _rows(chain, list(range(140, 156)), prompt)
    out = model.step([other, verify], kv)[1]
    for i in range(16):
        assert torch.equal(out[i], sequential[i]), i
    assert torch.equal(kv.keys(torch.arange(140, 156)), kv.keys(torch.arange(60, 76)))
