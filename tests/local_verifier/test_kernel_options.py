"""The kernel switches: read from the environment once, when a model is built; a step runs
on the model's options whatever the environment says by then."""

from __future__ import annotations

import pytest
import torch

from local_verifier.config import ModelConfig
from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.options import (
    AMX_ENV,
    BACKEND_ENV,
    FUSED_ENV,
    PACKED_ENV,
    KernelOptions,
)
from local_verifier.model import Transformer

CFG = ModelConfig(
    vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, hidden_dim=48
)


def test_every_switch_is_on_unless_set_to_zero() -> None:
    assert KernelOptions.from_env({}) == KernelOptions("", True, True, True)
    off = {FUSED_ENV: "0", PACKED_ENV: "0", AMX_ENV: "0", BACKEND_ENV: "torch"}
    assert KernelOptions.from_env(off) == KernelOptions("torch", False, False, False)
    on = {FUSED_ENV: "1", PACKED_ENV: "yes", AMX_ENV: "", BACKEND_ENV: "cpp"}
    assert KernelOptions.from_env(on) == KernelOptions("cpp", True, True, True)


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match=BACKEND_ENV):
        KernelOptions.from_env({BACKEND_ENV: "cuda"})


def test_a_model_reads_the_switches_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FUSED_ENV, "0")
    monkeypatch.setenv(PACKED_ENV, "0")
    model = Transformer.from_config(CFG, "cpu", torch.bfloat16)
    assert model.kernel_options == KernelOptions(fused=False, packed=False)
    monkeypatch.delenv(FUSED_ENV)
    monkeypatch.delenv(PACKED_ENV)
    assert model.kernel_options == KernelOptions(fused=False, packed=False)
    if load_library()[0] is not None:  # the C++ backend: its step follows the options
        assert model.fused_stack() is None
        assert model.layers[0].attn.wqkv.weight.dim() == 2  # type: ignore[union-attr]
        model.kernel_options = KernelOptions()
        assert model.fused_stack() is not None
        assert model.layers[0].attn.wqkv.weight.dim() > 2  # type: ignore[union-attr]
