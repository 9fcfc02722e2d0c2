"""Plain decoding: greedy, sampling, EOS, stop strings, limits, streaming text."""

from __future__ import annotations

import pytest
import torch

from local_verifier.errors import PromptTooLong
from local_verifier.loader import LoadedModel
from local_verifier.output import TextDelta
from local_verifier.sampling import SamplingParams
from local_verifier.testing.generate import PlainResult, generate_plain
from local_verifier.testing.kv_cache import forward, new_cache
from local_verifier.tokenizer import IncrementalDetokenizer


def _run(lm: LoadedModel, prompt: list[int], **kw) -> tuple[str, PlainResult]:
    items = list(generate_plain(lm, prompt, kw.pop("params", SamplingParams()), **kw))
    result = items[-1]
    assert isinstance(result, PlainResult)
    text = "".join(i.text for i in items[:-1] if isinstance(i, TextDelta))
    return text, result


def _greedy_reference(lm: LoadedModel, prompt: list[int], n: int) -> list[int]:
    cache = new_cache(lm, len(prompt) + n)
    out = [int(forward(lm.model, torch.tensor(prompt), cache)[-1].argmax())]
    while len(out) < n:
        out.append(int(forward(lm.model, torch.tensor(out[-1:]), cache)[-1].argmax()))
    return out


def test_greedy_and_max_tokens(tiny_lm: LoadedModel) -> None:
    prompt = tiny_lm.tokenizer.encode("def add(a, b):")
    tiny_lm.tokenizer.eos_ids, saved = set(), tiny_lm.tokenizer.eos_ids
    try:
        text, result = _run(tiny_lm, prompt, max_tokens=12)
    finally:
        tiny_lm.tokenizer.eos_ids = saved
    assert result.finish_reason == "length"
    assert result.token_ids == _greedy_reference(tiny_lm, prompt, 12)
    assert text == tiny_lm.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    assert result.prompt_tokens == len(prompt)


def test_eos_ends_without_emitting(tiny_lm: LoadedModel) -> None:
    prompt = tiny_lm.tokenizer.encode("The quick brown fox")
    expected = _greedy_reference(tiny_lm, prompt, 8)
    tiny_lm.tokenizer.eos_ids, saved = {expected[3]}, tiny_lm.tokenizer.eos_ids
    try:
        _, result = _run(tiny_lm, prompt, max_tokens=8)
    finally:
        tiny_lm.tokenizer.eos_ids = saved
    first = expected.index(expected[3])
    assert result.finish_reason == "stop"
    assert result.token_ids == expected[:first]


def test_stop_string_across_tokens(tiny_lm: LoadedModel) -> None:
    prompt = tiny_lm.tokenizer.encode("The quick")
    tiny_lm.tokenizer.eos_ids, saved = set(), tiny_lm.tokenizer.eos_ids
    try:
        full, _ = _run(tiny_lm, prompt, max_tokens=20)
        stop = full[5:9]
        assert len(stop) == 4
        text, result = _run(tiny_lm, prompt, max_tokens=20, stop=[stop])
    finally:
        tiny_lm.tokenizer.eos_ids = saved
    assert result.finish_reason == "stop"
    assert text == full[: full.index(stop)]


def test_sampling_is_seeded(tiny_lm: LoadedModel) -> None:
    prompt = tiny_lm.tokenizer.encode("emoji")
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=11)
    _, a = _run(tiny_lm, prompt, max_tokens=16, params=params)
    _, b = _run(tiny_lm, prompt, max_tokens=16, params=params)
    _, c = _run(tiny_lm, prompt, max_tokens=16, params=SamplingParams(temperature=1.0, seed=12))
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_bad_input_raises_before_decoding(tiny_lm: LoadedModel) -> None:
    too_long = [5] * tiny_lm.context_length
    with pytest.raises(PromptTooLong, match="context"):
        generate_plain(tiny_lm, too_long, SamplingParams())
    with pytest.raises(ValueError):
        generate_plain(tiny_lm, [], SamplingParams())
    with pytest.raises(ValueError):
        generate_plain(tiny_lm, [5], SamplingParams(), max_tokens=0)


def test_generation_stops_at_end_of_context(tiny_lm: LoadedModel) -> None:
    prompt = [5] * (tiny_lm.context_length - 3)
    tiny_lm.tokenizer.eos_ids, saved = set(), tiny_lm.tokenizer.eos_ids
    try:
        _, result = _run(tiny_lm, prompt, max_tokens=100)
    finally:
        tiny_lm.tokenizer.eos_ids = saved
    assert result.finish_reason == "length" and len(result.token_ids) == 3


def test_incremental_detokenizer_never_splits_characters(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    text = "한국어 🙂🚀 naïve — 日本語 text"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert any(p == "" for p in pieces)  # some tokens are partial characters


@pytest.mark.slow
def test_smollm2_chat_answer(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}]))
    text, result = _run(smollm2, prompt, max_tokens=40)
    assert "4" in text
    assert result.finish_reason in ("stop", "length")
