"""SmolLM2 GGUF: our model and tokenizer against transformers loading the same file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from local_verifier.loader import LoadedModel
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from local_verifier.testing.kv_cache import forward, new_cache
from tests.conftest import WORKLOAD

CODE_EDIT_IDS = [
    json.loads(line)["id"]
    for line in WORKLOAD.read_text().splitlines()
    if line.strip() and json.loads(line)["category"] == "code_edit"
]

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The capital of France is Paris. The capital of Germany is",
    "한국어로 된 문장을 하나 써 보세요. 오늘 날씨는",
    "Emoji test 🙂🚀🔥 — what do these mean? 👍",
]
TEXTS = [
    *PROMPTS,
    "    four leading spaces\n\ttab then text",
    " leading space",
    "x = [1, 22, 333, 4444, 55555]  # numbers 2026",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><file_sep>print('hi')<repo_name>",
    "日本語とKorean 混合 text, naïve café",
    "",
]
CHATS = [
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? 🙂"},
    ],
    [
        {"role": "system", "content": "You answer in Korean."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "안녕하세요"},
        {"role": "user", "content": "Thanks"},
    ],
]


def test_token_ids_match_reference(smollm2: LoadedModel, hf_smollm2_tokenizer: Any) -> None:
    for text in TEXTS:
        ref = hf_smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert smollm2.tokenizer.encode(text) == ref, text
        assert smollm2.tokenizer.decode(ref) == hf_smollm2_tokenizer.decode(ref)


def test_special_tokens_and_eos(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    assert tok.encode("<|im_end|>") == [2]
    assert tok.eos_ids == {2}
    assert tok.vocab_size == 49152
    assert len(tok.fingerprint) == 16


def test_chat_template_matches_reference(smollm2: LoadedModel, hf_smollm2_tokenizer: Any) -> None:
    for messages in CHATS:
        for add in (True, False):
            ours = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=add)
            ref = hf_smollm2_tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add
            )
            assert ours == ref


@pytest.mark.slow
def test_logits_match_reference(smollm2: LoadedModel, hf_smollm2: Any) -> None:
    for prompt in PROMPTS:
        ids = smollm2.tokenizer.encode(prompt)
        ours = forward(smollm2.model, torch.tensor(ids), new_cache(smollm2, len(ids)))
        with torch.no_grad():
            ref = hf_smollm2(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-3)
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize("prompt_id", CODE_EDIT_IDS)
def test_greedy_64_tokens_match_reference_on_code_edits(
    smollm2: LoadedModel, hf_smollm2: Any, workload_path: Path, prompt_id: str
) -> None:
    """Each of our greedy tokens is transformers' argmax after the same prefix (teacher forcing),
    which is exactly the condition for transformers' greedy output to be identical."""
    rows = [json.loads(line) for line in workload_path.read_text().splitlines() if line.strip()]
    (row,) = [r for r in rows if r["id"] == prompt_id]
    tok = smollm2.tokenizer
    prompt = tok.encode(tok.apply_chat_template(row["messages"]))
    *_, result = generate_plain(smollm2, prompt, SamplingParams(), max_tokens=64)
    assert isinstance(result, PlainResult)
    ours = result.token_ids
    assert len(ours) == 64 or result.finish_reason == "stop"
    full = prompt + ours + ([min(tok.eos_ids)] if len(ours) < 64 else [])
    with torch.no_grad():
        logits = hf_smollm2(torch.tensor([full[:-1]])).logits[0]
    reference = logits[len(prompt) - 1 :].argmax(-1).tolist()
    assert reference == full[len(prompt) :]
