"""The incremental detokenizer on the real SmolLM2 tokenizer: text equal to decoding the
whole output, work linear in the output (counted in ids decoded) however long it decodes to
nothing or to an incomplete character, and a typed error for ids outside the vocabulary."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from local_verifier.gguf_file import GGUFFile
from local_verifier.gguf_loader import read_tokenizer
from local_verifier.loader import smollm2_path
from local_verifier.output import OutputAssembler
from local_verifier.tokenizer import (
    _BYTE_OF_CHAR,
    IncrementalDetokenizer,
    Tokenizer,
    UnknownTokenId,
)

N = 10_000


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return read_tokenizer(GGUFFile(smollm2_path()))


def _byte_token(tok: Tokenizer, byte: int) -> int:
    char = next(c for c, b in _BYTE_OF_CHAR.items() if b == byte)
    token = tok.backend.token_to_id(char)
    assert token is not None and tok.token_bytes(token) == bytes([byte])
    return token


def _stream(tok: Tokenizer, ids: list[int], monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """The streamed text of ``ids`` pushed one at a time, and the ids decoded for it."""
    decoded = 0
    decode: Callable[..., str] = tok.decode

    def counting(ids: list[int], skip_special_tokens: bool = False) -> str:
        nonlocal decoded
        decoded += len(ids)
        return decode(ids, skip_special_tokens)

    with monkeypatch.context() as patch:
        patch.setattr(tok, "decode", counting)
        detok = IncrementalDetokenizer(tok)
        text = "".join(detok.push([i]) for i in ids) + detok.flush()
    return text, decoded


def test_special_tokens_cost_nothing(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    hello, world = tok.encode("Hello"), tok.encode(" world")
    special = sorted(tok.special_ids)[:3]
    ids = hello + [special[i % 3] for i in range(N)] + world
    text, decoded = _stream(tok, ids, monkeypatch)
    assert text == tok.decode(ids, skip_special_tokens=True) == "Hello world"
    assert decoded <= 20  # the two words; re-decoding all would be ~N**2


def test_invalid_utf8_runs_are_linear_and_exact(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    cont, lead = _byte_token(tok, 0x80), _byte_token(tok, 0xE4)
    han = [lead, _byte_token(tok, 0xB8), _byte_token(tok, 0xAD)]  # 中, a byte at a time
    ids = [cont] * N + han + [lead] * 7 + han + tok.encode(" ok") + [cont, lead]
    text, decoded = _stream(tok, ids, monkeypatch)
    assert text == tok.decode(ids, skip_special_tokens=True)
    assert text.startswith("\ufffd" * N + "中") and "\ufffd中 ok" in text
    assert decoded <= 100 * len(ids)  # the whole output every token: ~N**2


def test_random_outputs_stream_as_they_decode(tok: Tokenizer) -> None:
    rng = random.Random(0)
    special = sorted(tok.special_ids)
    for _ in range(200):
        ids = [
            rng.choice(special)
            if r < 0.2
            else rng.randrange(tok.vocab_size)
            if r < 0.6
            else rng.randrange(600)  # mostly single bytes
            for r in (rng.random() for _ in range(rng.randint(1, 60)))
        ]
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push([i]) for i in ids] + [detok.flush()]
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("bad", [-1, N * 100, 2**40])
def test_an_id_outside_the_vocabulary_is_a_typed_error(tok: Tokenizer, bad: int) -> None:
    with pytest.raises(UnknownTokenId, match=str(bad)):
        tok.decode([1, bad])
    with pytest.raises(UnknownTokenId):
        tok.token_bytes(bad)
    with pytest.raises(UnknownTokenId):
        IncrementalDetokenizer(tok).push([bad])
    assert tok.decode([tok.vocab_size - 1]) is not None


def test_a_models_padding_rows_decode_to_nothing(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model with more rows than its tokenizer has ids (the loader raises ``id_limit``
    to the model's vocabulary): those ids decode to nothing; past them is an error."""
    monkeypatch.setattr(tok, "id_limit", tok.vocab_size + 64)
    padding = tok.vocab_size + 10
    assert tok.decode([padding]) == "" and tok.token_bytes(padding) == b""
    detok = IncrementalDetokenizer(tok)
    assert detok.push(tok.encode("Hi") + [padding]) + detok.flush() == "Hi"
    with pytest.raises(UnknownTokenId):
        tok.decode([tok.vocab_size + 64])


def test_the_assembler_reports_its_host_time_per_token(tok: Tokenizer) -> None:
    """The step plan reads it as each row's host cost (``step._host_seconds_per_row``)."""
    output = OutputAssembler(tok, ["never said"], 100)
    assert output.seconds_per_token == 0.0
    delta = output.push(tok.encode("Hello there, world"))
    assert delta.text and output.seconds_per_token > 0.0
