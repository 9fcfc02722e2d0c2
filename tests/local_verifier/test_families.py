"""Tiny random-weight checkpoints of each supported family, built and saved by transformers
(safetensors): logits close to transformers (atol 1e-4, float32) past the sliding window,
greedy decoding identical to transformers' generate, and a draft chain, prompt chunks and
a batch bitwise equal to plain decoding on both kernel backends."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
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
            "num_hidden_layers": 6,  # Gemma's pattern: five sliding layers, one global
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


GGUF_ARCHS = {"Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3"}


def write_family_gguf(src: Path, dst: Path) -> Path:
    """``src``'s checkpoint as llama.cpp's converter writes it (float32; Gemma's norms as
    their 1 + w; the byte-level BPE vocabulary)."""
    import gguf
    from gguf import GGUFWriter
    from safetensors.torch import load_file

    cfg = json.loads((src / "config.json").read_text())
    arch = GGUF_ARCHS[cfg["architectures"][0]]
    gemma = arch == "gemma3"
    tok = json.loads((src / "tokenizer.json").read_text())
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    writer = GGUFWriter(str(dst), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    rope = cfg["rope_parameters"]
    writer.add_rope_freq_base(float(rope.get("full_attention", rope)["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if gemma:
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))
    vocab = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    )
    writer.add_bos_token_id(vocab[tok_cfg["bos_token"]])
    writer.add_eos_token_id(vocab[tok_cfg["eos_token"]])
    writer.add_chat_template(tok_cfg["chat_template"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg["num_hidden_layers"])
    for name, tensor in load_file(str(src / "model.safetensors")).items():
        array = tensor.float().numpy()
        if gemma and name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if not (name == "lm_head.weight" and cfg["tie_word_embeddings"]):
            writer.add_tensor(names.get_name(name, try_suffixes=(".weight",)), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@pytest.mark.parametrize("family_name", list(GGUF_ARCHS.values()))
def test_gguf_bitwise_as_the_directory(family_name: str, tmp_path: Path) -> None:
    """The same float32 weights from a GGUF file and from the directory: the same config
    and bitwise the same logits."""
    directory = write_family(tmp_path / family_name, family_name)
    from_dir = load_model(str(directory), device="cpu", dtype="float32", tune_threads=False)
    path = write_family_gguf(directory, tmp_path / f"{family_name}.gguf")
    from_gguf = load_model(str(path), device="cpu", dtype="float32", tune_threads=False)
    assert replace(from_gguf.config, norm_eps=0.0, max_seq_len=0) == replace(
        from_dir.config, norm_eps=0.0, max_seq_len=0
    )
    ids = from_dir.tokenizer.encode(PROMPTS[1])
    assert from_gguf.tokenizer.encode(PROMPTS[1]) == ids
    assert torch.equal(plain_decode(from_gguf, ids, 4)[1], plain_decode(from_dir, ids, 4)[1])
