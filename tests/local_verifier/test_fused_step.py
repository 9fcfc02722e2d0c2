"""The fused C++ layer stack (one call per step) against the per-op C++ path
(``KernelOptions.fused`` off): bitwise the same logits and K/V for prompt chunks, decode rows,
chains, trees and several sequences in one step, with float32 and bfloat16 weights (on
CPUs with AMX, a bf16 model whose linear weights all take the AMX kernels too)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from local_verifier.config import ModelConfig
from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.options import AMX_ENV, KernelOptions
from local_verifier.kernels.packing import is_packed, layout_of
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear
from local_verifier.loader import LoadedModel, load_model
from local_verifier.model import Transformer
from tests.local_verifier.conftest import AMX_TINY_CFG
from tests.local_verifier.fused_scripts import Script, assert_fused_is_per_op, assert_same_runs, run
from tests.local_verifier.fused_scripts import script as make_script

LIBRARY, WHY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason=f"no C++ kernels here: {WHY}")

# dim 37, head_dim 12 and hidden 75 end every reduction in a partial vector
CFG = ModelConfig(
    vocab_size=101,
    dim=37,
    n_layers=3,
    n_heads=6,
    n_kv_heads=2,
    head_dim=12,
    hidden_dim=75,
    max_seq_len=512,
    qkv_bias=True,
)
AMX_CFG = AMX_TINY_CFG
AMX = LIBRARY is not None and LIBRARY.dg_bf16_kernels() != 0
# (config, weight dtype) of the fused-vs-per-op comparisons
MODELS = [(CFG, torch.float32), (CFG, torch.bfloat16), (AMX_CFG, torch.bfloat16)]
MODEL_IDS = ["fp32", "bf16", "bf16-amx"]


def _run(
    model: Transformer, script: Script, fused: bool, mp: pytest.MonkeyPatch, threads: int = 0
) -> tuple[list[list[torch.Tensor]], KVStorage]:
    return run(model, script, fused, mp, threads)


def _linear_weights(model: Transformer) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, Linear)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("cfg", "dtype"), MODELS, ids=MODEL_IDS)
def test_fused_step_is_bitwise_the_per_op_step(
    cfg: ModelConfig, dtype: torch.dtype, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Transformer.from_config(cfg, "cpu", dtype)
    script = make_script(cfg.vocab_size, 70)  # 70: two row blocks
    assert_fused_is_per_op(model, script, monkeypatch, threads)
    if cfg is AMX_CFG:
        expected = "amx" if AMX and model.kernel_options.amx else "packed"
        assert all(layout_of(w) == expected for w in _linear_weights(model))


@pytest.mark.parametrize(("cfg", "dtype"), MODELS, ids=MODEL_IDS)
def test_the_fused_step_is_the_same_on_one_thread_and_two(
    cfg: ModelConfig, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the engine switches its thread count while serving (devices.ThreadTuner)
    model = Transformer.from_config(cfg, "cpu", dtype)
    script = make_script(cfg.vocab_size, 70)
    assert_same_runs(*(_run(model, script, True, monkeypatch, t) for t in (1, 2)))


def test_the_stack_follows_casts_and_in_place_weight_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Transformer.from_config(CFG, "cpu", torch.float32)
    script = make_script(CFG.vocab_size, 20)[:3]
    assert_fused_is_per_op(model, script, monkeypatch)
    with torch.no_grad():  # copied into the same storage: the stack reads them next step
        for p in model.parameters():
            p.mul_(1.5)
    assert_fused_is_per_op(model, script, monkeypatch)
    model.to(torch.bfloat16)  # new parameters: a new stack
    assert_fused_is_per_op(model, script, monkeypatch)


@pytest.fixture(scope="module")
def smollm2_bf16() -> Iterator[LoadedModel]:
    yield load_model("smollm2-135m", device="cpu", dtype="bf16", tune_threads=False)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_smollm2_fused_step_is_bitwise_the_per_op_step(
    dtype: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm: LoadedModel = request.getfixturevalue("smollm2" if dtype == "fp32" else "smollm2_bf16")
    assert_fused_is_per_op(lm.model, make_script(lm.config.vocab_size, 40), monkeypatch)


# every linear weight but the head (vocab 101) packable: both layouts in one stack
PACKED_CFG = ModelConfig(
    vocab_size=101,
    dim=48,
    n_layers=2,
    n_heads=6,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=80,
    max_seq_len=512,
    qkv_bias=True,
)


def test_packed_bf16_weights_give_bitwise_the_row_major_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 weights packed on the C++ backend (fused and per-op) against the same model
    row-major (``KernelOptions.packed`` off): the same logits and K/V. State dicts are row-major;
    the layout follows the backend: row-major again for the torch kernels and after a cast
    (fp32 stays row-major)."""
    model = Transformer.from_config(PACKED_CFG, "cpu", torch.bfloat16)
    script = make_script(PACKED_CFG.vocab_size, 40)
    wqkv, head = model.layers[0].attn.wqkv, model.head  # type: ignore[union-attr]
    model.kernel_options = KernelOptions(packed=False)
    row_major, kv_ref = _run(model, script, True, monkeypatch)
    assert not is_packed(wqkv.weight)
    model.kernel_options = KernelOptions()
    assert_fused_is_per_op(model, script, monkeypatch)  # packed, fused and per-op alike
    packed, kv = _run(model, script, True, monkeypatch)
    assert is_packed(wqkv.weight) and not is_packed(head.weight)
    saved = model.state_dict()  # row-major, and loaded into the packed model packed
    assert saved["layers.0.attn.wqkv.weight"].shape == (80, 48)
    model.load_state_dict({k: v.clone() for k, v in saved.items()})
    assert is_packed(wqkv.weight)
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    for i, (a, b) in enumerate(zip(packed, row_major, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"step {i}"
    assert torch.equal(kv.k, kv_ref.k) and torch.equal(kv.v, kv_ref.v)
    model.kernel_options = KernelOptions(backend="torch")
    model.step(script[1], KVStorage(model.config, 400, "cpu", model.kv_dtype))
    assert not is_packed(wqkv.weight)
    _run(model, script[:2], True, monkeypatch)
    model.to(torch.float32)
    assert not is_packed(wqkv.weight) and wqkv.weight.shape == (80, 48)
    _run(model, script[:2], True, monkeypatch)
    assert not is_packed(wqkv.weight)


@pytest.mark.skipif(not AMX, reason="no bf16 kernels here (AMX-BF16 or AVX512-BF16)")
def test_amx_weights_follow_the_switch_and_save_row_major(monkeypatch: pytest.MonkeyPatch) -> None:
    """``KernelOptions.amx`` off (``DRAFTGATE_AMX=0``) repacks the weights for the float32
    kernels (a different but close y) and back; state dicts are row-major and load into the
    AMX layout."""
    monkeypatch.setenv(AMX_ENV, "1")
    model = Transformer.from_config(AMX_CFG, "cpu", torch.bfloat16)
    script = make_script(AMX_CFG.vocab_size, 40)
    amx, kv = _run(model, script, True, monkeypatch)
    assert all(layout_of(w) == "amx" for w in _linear_weights(model))
    model.kernel_options = KernelOptions(amx=False)
    fp32, _ = _run(model, script, True, monkeypatch)
    assert all(layout_of(w) == "packed" for w in _linear_weights(model))
    model.kernel_options = KernelOptions()
    for a, b in zip(amx, fp32, strict=True):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, atol=0.05, rtol=0.05)
    saved = model.state_dict()
    assert saved["layers.0.attn.wqkv.weight"].shape == (96, 64)
    model.load_state_dict({k: v.clone() for k, v in saved.items()})
    again, kv_again = _run(model, script, True, monkeypatch)
    assert all(layout_of(w) == "amx" for w in _linear_weights(model))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    for i, (a, b) in enumerate(zip(amx, again, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"step {i}"
    assert torch.equal(kv.k, kv_again.k) and torch.equal(kv.v, kv_again.v)
