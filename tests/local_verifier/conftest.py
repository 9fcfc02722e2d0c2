"""Shared model fixtures: the real SmolLM2 (ours and the transformers reference) and a tiny
random-weight checkpoint written to disk in Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from local_verifier.config import ModelConfig
from local_verifier.loader import LoadedModel, load_model, smollm2_path
from local_verifier.testing.reference import load_reference

# dims multiples of 32 and a vocabulary of 16 x 11: every bf16 linear weight AMX-packed
# (where the CPU has AMX), 11 column tiles in the head
AMX_TINY_CFG = ModelConfig(
    vocab_size=176,
    dim=64,
    n_layers=2,
    n_heads=8,
    n_kv_heads=2,
    head_dim=8,
    hidden_dim=96,
    max_seq_len=512,
    qkv_bias=True,
)

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are tiny.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. 12345 67890",
    "안녕하세요 세계. 한국어 문장입니다.",
    "emoji 🙂🚀 and café, naïve, 日本語",
    "    indented = {'key': [1, 2, 3]}  # comment\n",
] * 20


def write_tiny_tokenizer(directory: Path) -> None:
    """A small byte-level BPE tokenizer trained on a fixed corpus, with chat specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=TINY_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TINY_CORPUS, trainer)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
            }
        )
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}))


def write_tiny_checkpoint(
    directory: Path, arch: str = "llama", shards: int = 1, **overrides: Any
) -> Path:
    """A random-weight Llama or Qwen2 checkpoint saved by transformers (safetensors)."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    common: dict[str, Any] = dict(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    shard = (
        "1GB"
        if shards == 1
        else f"{sum(p.numel() for p in model.parameters()) * 4 // shards // 1000 + 1}KB"
    )
    model.save_pretrained(directory, max_shard_size=shard)
    return directory


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of a tiny random Llama checkpoint in Hugging Face layout."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_lm(tiny_checkpoint: Path) -> LoadedModel:
    """A tiny random-weight model + tokenizer (fp32 CPU), loaded through ``load_model``."""
    return load_model(str(tiny_checkpoint), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def hf_smollm2() -> Any:
    """transformers' own model for the same GGUF file (its dequantization and layout), fp32."""
    model = load_reference("smollm2-135m")
    assert model.lm_head.weight.device.type == "cpu"
    return model


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer() -> Any:
    """transformers' tokenizer rebuilt from the same GGUF file."""
    from transformers import AutoTokenizer

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
