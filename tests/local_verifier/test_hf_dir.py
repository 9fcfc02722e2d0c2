"""A tiny random checkpoint in Hugging Face layout: ours vs transformers on the same files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from local_verifier.loader import LoadedModel, load_model
from local_verifier.testing.kv_cache import forward, new_cache
from tests.local_verifier.conftest import write_tiny_checkpoint

TEXTS = [
    "def add(a, b):\n    return a + b",
    "  leading spaces and\ttabs",
    "안녕하세요 세계",
    "emoji 🙂🚀 café",
    "<|im_start|>user\nhi<|im_end|>",
]


def _hf_logits(hf_model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float()


def _our_logits(lm: LoadedModel, ids: list[int]) -> torch.Tensor:
    return forward(lm.model, torch.tensor(ids), new_cache(lm, len(ids)))


@pytest.mark.parametrize(
    ("arch", "shards", "extra"),
    [
        ("llama", 1, {}),
        ("llama", 3, {"tie_word_embeddings": True}),
        ("qwen2", 1, {}),
        (
            "llama",
            1,
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                }
            },
        ),
        ("llama", 1, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ],
)
def test_logits_match_transformers(tmp_path: Path, arch: str, shards: int, extra: dict) -> None:
    import transformers

    directory = write_tiny_checkpoint(tmp_path / arch, arch=arch, shards=shards, **extra)
    if shards > 1:
        assert (directory / "model.safetensors.index.json").exists()
    ours = load_model(str(directory), device="cpu", dtype="float32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = ours.tokenizer.encode("def add(a, b):\n    return a + b  # 🙂 안녕 " * 6)
    assert len(ids) > 40
    torch.testing.assert_close(_our_logits(ours, ids), _hf_logits(hf, ids), atol=2e-4, rtol=1e-4)


def test_greedy_matches_transformers(tiny_checkpoint: Path, tiny_lm: LoadedModel) -> None:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    ids = tiny_lm.tokenizer.encode("The quick brown fox")
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    expected = out[0, len(ids) :].tolist()
    cache = new_cache(tiny_lm, len(ids) + 24)
    tokens = [int(forward(tiny_lm.model, torch.tensor(ids), cache)[-1].argmax())]
    while len(tokens) < 24:
        tokens.append(int(forward(tiny_lm.model, torch.tensor(tokens[-1:]), cache)[-1].argmax()))
    assert tokens == expected


def test_tokenizer_and_template_match_transformers(
    tiny_checkpoint: Path, tiny_lm: LoadedModel
) -> None:
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(tiny_checkpoint)
    for text in TEXTS:
        assert tiny_lm.tokenizer.encode(text) == ref.encode(text, add_special_tokens=False)
        ids = ref.encode(text, add_special_tokens=False)
        assert tiny_lm.tokenizer.decode(ids) == ref.decode(ids)
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again 🙂"},
    ]
    for messages in (chat, [{"role": "system", "content": "be brief"}, *chat]):
        assert tiny_lm.tokenizer.apply_chat_template(messages) == ref.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
    assert tiny_lm.tokenizer.eos_ids == {2}
