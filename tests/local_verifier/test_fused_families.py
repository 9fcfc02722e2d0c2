"""Every family's layer in the fused C++ stack: Qwen3 (per-head q/k norms), Gemma 3 (q/k
norms, norms after attention and MLP, GeGLU, a scaled embedding, sliding and global layers
with their own rope bases), Mistral (a window on every layer) and Qwen2 (q/k/v biases,
windows on some layers), on tiny random-weight models: bitwise the per-op C++ path
(``torch.equal`` on every step's logits and the K/V) for prompts, decode rows, chains, trees,
several sequences in one step and chunked prompts, with float32, bfloat16 (row-major, and
packed for the bf16 kernels where the CPU has them) and GGUF quantized weights, on one
thread and two; and a row's logits the same alone, in 7 rows and in 64."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from torch import nn

from local_verifier.config import ModelConfig
from local_verifier.kernels.cpp import load_library
from local_verifier.kernels.packing import QUANT_TYPES, layout_of
from local_verifier.kv_storage import KVStorage
from local_verifier.linear import Linear
from local_verifier.loader import GEMMA3_ALIAS, load_model
from local_verifier.model import RMSNorm, SeqStep, Transformer
from tests.local_verifier.conftest import AMX_TINY_CFG
from tests.local_verifier.fused_scripts import (
    assert_fused_is_per_op,
    assert_same_runs,
    rows,
    run,
    script,
    tokens,
    tree,
)

LIBRARY, WHY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason=f"no C++ kernels here: {WHY}")

WINDOW = 24  # shorter than the scripts' contexts: the sliding layers cut their keys
PROMPT = 64
# dim 37, head_dim 12 and hidden 75 end every reduction in a partial vector
ODD = ModelConfig(
    vocab_size=101, dim=37, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=12, hidden_dim=75,
    max_seq_len=512,
)  # fmt: skip
SLIDING = ("sliding_attention", "full_attention", "sliding_attention")
FAMILIES: dict[str, dict[str, object]] = {
    "qwen3": dict(qk_norm=True, sliding_window=WINDOW, layer_types=SLIDING),
    "gemma3": dict(
        qk_norm=True,
        post_norms=True,
        activation="gelu_tanh",
        embed_scale=ODD.dim**0.5,
        sliding_window=WINDOW,
        layer_types=SLIDING,
        rope_theta=1e6,
        rope_local_theta=10000.0,
        tie_embeddings=True,
    ),
    "mistral": dict(sliding_window=WINDOW),
    "qwen2-window": dict(qkv_bias=True, sliding_window=WINDOW, layer_types=SLIDING),
}
SHAPES = {"odd": ODD, "packable": replace(AMX_TINY_CFG, qkv_bias=False, n_layers=3)}
WEIGHTS = [("odd", torch.float32), ("odd", torch.bfloat16), ("packable", torch.bfloat16)]
WEIGHT_IDS = ["fp32", "bf16", "bf16-packed"]
EPS = {"attn_norm": 1e-5, "ffn_norm": 2e-4, "q_norm": 3e-3, "k_norm": 4e-6}
POST_EPS = {"post_attn_norm": 5e-4, "post_ffn_norm": 6e-3}


def family_model(family: str, shape: str, dtype: torch.dtype) -> Transformer:
    """A random-weight model of ``family``'s layer: norm weights 1 +- 0.2 and a different
    epsilon per kind of norm, so that a norm read in another's place changes the bits."""
    cfg = replace(SHAPES[shape], **FAMILIES[family])  # type: ignore[arg-type]
    model = Transformer.from_config(cfg, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, RMSNorm):
                module.weight.add_(torch.randn(module.weight.shape, generator=gen) * 0.2)
                module.eps = {**EPS, **POST_EPS}.get(name.rpartition(".")[2], module.eps)
    return model.to(dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "dtype"), WEIGHTS, ids=WEIGHT_IDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_family_step_is_bitwise_the_per_op_step(
    family: str, shape: str, dtype: torch.dtype, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = family_model(family, shape, dtype)
    assert_fused_is_per_op(model, script(model.config.vocab_size, PROMPT), monkeypatch, threads)
    if shape == "packable" and model.fused_stack() is not None:  # the linears' packed layout
        wqkv = model.layers[0].attn.wqkv.weight  # type: ignore[union-attr]
        assert layout_of(wqkv) in ("packed", "amx")


@pytest.mark.parametrize(("shape", "dtype"), WEIGHTS[:2], ids=WEIGHT_IDS[:2])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_family_step_is_the_same_on_one_thread_and_two(
    family: str, shape: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = family_model(family, shape, dtype)
    steps = script(model.config.vocab_size, PROMPT)
    assert_same_runs(*(run(model, steps, True, monkeypatch, t) for t in (1, 2)))


def _quantized(model: Transformer, qtype: GGMLQuantizationType) -> Transformer:
    """``model`` with every linear weight replaced by GGUF blocks of ``qtype`` (the gguf
    package's quantizer), as ``dtype="native"`` holds them."""
    size, _ = QUANT_TYPES[qtype]
    for module in model.modules():
        if isinstance(module, Linear):
            blocks = torch.from_numpy(quantize(module.weight.detach().numpy(), qtype))
            shaped = blocks.view(module.weight.shape[0], -1, size)
            module.weight = nn.Parameter(shaped, requires_grad=False)
    return model


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_1])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_family_step_on_quantized_blocks_is_bitwise_the_per_op_step(
    family: str, qtype: GGMLQuantizationType, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _quantized(family_model(family, "packable", torch.float32), qtype)
    assert layout_of(model.head.weight) == "quant"
    for threads in (1, 2):
        assert_fused_is_per_op(model, script(model.config.vocab_size, PROMPT), monkeypatch, threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_family_rows_are_the_same_alone_in_7_and_in_64(
    family: str, dtype: torch.dtype
) -> None:
    """A 64-row prompt (past the window) in one step, in chunks of 7 and row by row: every
    row's logits bitwise the same on the fused stack."""
    model = family_model(family, "odd", dtype)
    assert model.fused_stack() is not None
    toks = torch.randint(
        0, model.config.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(5)
    )

    def prompt_in(size: int) -> torch.Tensor:
        kv = KVStorage(model.config, PROMPT, "cpu", model.kv_dtype)
        outs = []
        for start in range(0, PROMPT, size):
            new = torch.arange(start, min(start + size, PROMPT))
            (logits,) = model.step([SeqStep(toks[new], new, new, torch.arange(start))], kv)
            outs.append(logits)
        return torch.cat(outs)

    whole = prompt_in(PROMPT)
    assert torch.equal(prompt_in(7), whole)
    assert torch.equal(prompt_in(1), whole)


def _long_script(vocab: int, window: int) -> list[list[SeqStep]]:
    """A prompt past ``window`` in two chunks, a decode row, a chain, a tree, and a step of
    two sequences (one of them a fresh prompt of 7 rows)."""
    n = window + 88
    prompt, half = tokens(n, 11, vocab), window // 2 + 17
    return [
        [rows(prompt[:half], 0, 0, logits="last")],
        [rows(prompt[half:], half, half)],
        [rows(tokens(1, 12, vocab), n, n)],
        [rows(tokens(5, 13, vocab), n + 1, n + 1)],
        [tree(tokens(8, 14, vocab), n + 6, n + 6)],
        [rows(tokens(1, 15, vocab), n + 14, n + 1), rows(tokens(7, 16, vocab), n + 15, 0)],
    ]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "native"])
def test_gemma3_270m_fused_step_is_bitwise_the_per_op_step(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Gemma 3 270M (its Q4_K_M file as float32, or as its blocks) past its
    512-token sliding window: the fused stack and the per-op path bitwise alike."""
    lm = load_model(GEMMA3_ALIAS, device="cpu", dtype=dtype, max_seq_len=1024, tune_threads=False)
    cfg = lm.config
    assert cfg.sliding_window is not None and cfg.rope_local_theta is not None
    steps = _long_script(cfg.vocab_size, cfg.sliding_window)
    assert_fused_is_per_op(lm.model, steps, monkeypatch, slots=cfg.sliding_window + 112)
