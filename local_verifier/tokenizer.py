"""Tokenizer (a ``tokenizers`` backend) with chat template, special ids and streaming decode."""

from __future__ import annotations

import hashlib
from typing import Any

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders

from local_verifier.chat_template import render_chat, uses_tools


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: printable bytes stand for themselves, the rest
    for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(0x100 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = _byte_of_char()


class Tokenizer:
    """Encode/decode text, render chat prompts; knows the end-of-sequence ids."""

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        eos_ids: set[int],
        bos_id: int | None = None,
        chat_template: str | None = None,
        special_tokens: dict[str, str] | None = None,
        add_bos: bool = False,
    ) -> None:
        self.backend = backend
        self.eos_ids = set(eos_ids)
        self.bos_id = bos_id
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self.add_bos = add_bos
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.fingerprint = hashlib.sha256(backend.to_str().encode()).hexdigest()[:16]
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        self._added = set(backend.get_added_tokens_decoder())

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` a BOS is prepended when the model wants one."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders ``tools`` (transformers' ``tools`` variable)."""
        return bool(self.chat_template) and uses_tools(self.chat_template or "")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (part of a UTF-8 character, possibly).

        Byte-level BPE maps each byte to one character of its vocabulary; other tokenizers
        give the token's decoded text (a lone byte-fallback token decodes to U+FFFD).
        """
        if self._byte_level and token_id not in self._added:
            piece = self.backend.id_to_token(token_id) or ""
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        return self.decode([token_id]).encode()

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for ``messages`` (the model's own template)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; send a plain prompt instead")
        return render_chat(self.chat_template, messages, self.special_tokens, add_generation_prompt)


class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas that never split a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded for context
        self._read = 0  # ids up to here have been emitted as text

    def push(self, ids: list[int]) -> str:
        """Add ``ids``; return the newly completed text."""
        self.ids.extend(ids)
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        before = decode(self.ids[self._prefix : self._read], skip)
        after = decode(self.ids[self._prefix :], skip)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """Whatever is left, even an incomplete character (as U+FFFD)."""
        before = self.tokenizer.decode(
            self.ids[self._prefix : self._read], self.skip_special_tokens
        )
        after = self.tokenizer.decode(self.ids[self._prefix :], self.skip_special_tokens)
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]
