"""Tiny random-weight checkpoints of each supported family, built and saved by transformers
(safetensors): logits close to transformers (atol 1e-4, float32) past the sliding window,
greedy decoding identical to transformers' generate, and a draft chain, prompt chunks and
a batch bitwise equal to plain decoding on both kernel backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from local_verifier.errors import ModelLoadError
from local_verifier.kernels.options import KernelOptions
from local_verifier.loader import LoadedModel, load_model
from tests.local_verifier.conftest import write_tiny_tokenizer
from tests.local_verifier.stepping import plain_decode, verify_batched

WINDOW = 24
LOGITS_ATOL = 1e-4
NEW_TOKENS = 12
COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-tied": ("Llama", {"rope_scaling": LLAMA3_SCALING, "tie_word_embeddings": True}),
    "llama3-untied": ("Llama", {"rope_scaling": LLAMA3_SCALING, "rope_theta": 500000.0}),
    "mistral": ("Mistral", {"sliding_window": WINDOW}),
    "qwen2-window": (
        "Qwen2",
        {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3", {}),
    "gemma3": (
        "Gemma3",
        {
            "sliding_window": WINDOW,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
            "tie_word_embeddings": True,
        },
    ),
}
PROMPTS = ["The quick brown fox", "def add(a, b):\n    return a + b  # 🙂 안녕 " * 5]


def write_family(directory: Path, family: str) -> Path:
    """A random-weight checkpoint of ``family`` saved by transformers."""
    import transformers

    prefix, overrides = FAMILIES[family]
    directory.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    config_class = getattr(transformers, f"{prefix}TextConfig", None) or getattr(
        transformers, f"{prefix}Config"
    )
    config = config_class(**{**COMMON, "vocab_size": len(vocab), **overrides})
    model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(ours, transformers') on one checkpoint."""
    import transformers

    directory = write_family(tmp_path_factory.mktemp(request.param), request.param)
    ours = load_model(str(directory), device="cpu", dtype="float32", tune_threads=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    return ours, hf.eval()


def test_config_reads_the_family(family: Any) -> None:
    ours, hf = family
    cfg, name = ours.config, type(hf).__name__
    assert cfg.qk_norm == name.startswith(("Qwen3", "Gemma3"))
    assert cfg.post_norms == name.startswith("Gemma3")
    if name.startswith(("Mistral", "Gemma3", "Qwen2")):
        assert cfg.sliding_window == WINDOW
    assert cfg.tie_embeddings == hf.config.tie_word_embeddings


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_and_greedy_match_transformers(family: Any, prompt: str) -> None:
    ours, hf = family
    ids = ours.tokenizer.encode(prompt)
    tokens, logits = plain_decode(ours, ids, NEW_TOKENS)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        reference = hf(out[:, :-1]).logits[0, len(ids) - 1 :].float()
    assert tokens == out[0, len(ids) :].tolist()
    torch.testing.assert_close(logits, reference, atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_drafts_chunks_and_batches_are_bitwise_plain(
    family: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours: LoadedModel = family[0]
    monkeypatch.setattr(ours.model, "kernel_options", KernelOptions(backend=backend))
    ids = ours.tokenizer.encode(PROMPTS[1])
    assert len(ids) > WINDOW + 8
    tokens, plain = plain_decode(ours, ids, NEW_TOKENS)
    other = ours.tokenizer.encode(PROMPTS[0])
    assert torch.equal(verify_batched(ours, ids, tokens, other, split=WINDOW // 2), plain)


def test_unsupported_architecture_names_the_supported(tmp_path: Path) -> None:
    directory = write_family(tmp_path / "qwen3", "qwen3")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(
        json.dumps({**config, "architectures": ["FalconForCausalLM"]})
    )
    with pytest.raises(ModelLoadError, match="supported: LlamaForCausalLM.*Gemma3ForCausalLM"):
        load_model(str(directory))
