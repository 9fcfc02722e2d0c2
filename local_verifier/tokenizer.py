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


class UnknownTokenId(ValueError):
    """A token id outside the tokenizer's vocabulary."""


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
        # ids that decode: the tokenizer's, and those of a model's padding rows past them
        # (which decode to nothing); the loader raises it to the model's vocabulary
        self.id_limit = self.vocab_size
        self.fingerprint = hashlib.sha256(backend.to_str().encode()).hexdigest()[:16]
        self._byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        added = backend.get_added_tokens_decoder()
        self._added = set(added)
        self.special_ids = frozenset(i for i, token in added.items() if token.special)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` a BOS is prepended when the model wants one."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return list(ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; `UnknownTokenId` for an id outside the vocabulary."""
        ids = list(ids)
        if ids:
            self.check_ids(min(ids), max(ids))
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def check_ids(self, *ids: int) -> None:
        """`UnknownTokenId` unless every one of ``ids`` is below ``id_limit``."""
        for token_id in ids:
            if not 0 <= token_id < self.id_limit:
                raise UnknownTokenId(
                    f"token id {token_id} is outside the vocabulary (0..{self.id_limit - 1})"
                )

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders ``tools`` (transformers' ``tools`` variable)."""
        return bool(self.chat_template) and uses_tools(self.chat_template or "")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (part of a UTF-8 character, possibly).

        Byte-level BPE maps each byte to one character of its vocabulary; other tokenizers
        give the token's decoded text (a lone byte-fallback token decodes to U+FFFD).
        """
        self.check_ids(token_id)
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
    """Turns a growing list of ids into text deltas that never split a UTF-8 character.

    Each push decodes a window of the last few ids (with the ids before them as context),
    so the work per id is bounded: skipped special tokens never enter the window, and ids
    that add no finished text (an incomplete or invalid UTF-8 run, ids decoding to nothing)
    are released once ``MAX_PENDING`` of them wait, all but the last ``HOLD`` (which may
    still begin a character), at the latest point whose text the window's text extends.
    """

    MAX_PENDING = 8  # ids waiting without finished text before some are released
    HOLD = 4  # ids kept back on a release: a UTF-8 character spans at most 4 bytes

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._skipped = tokenizer.special_ids if skip_special_tokens else frozenset()
        self.ids: list[int] = []  # the ids that decode to text (skipped ones left out)
        self._prefix = 0  # start of the window re-decoded for context
        self._read = 0  # ids up to here have been emitted as text

    def _decode(self, end: int | None = None) -> str:
        return self.tokenizer.decode(self.ids[self._prefix : end], self.skip_special_tokens)

    def push(self, ids: list[int]) -> str:
        """Add ``ids``; return the newly completed text."""
        if ids:
            self.tokenizer.check_ids(min(ids), max(ids))
        self.ids.extend(i for i in ids if i not in self._skipped)
        if len(self.ids) == self._read:
            return ""
        before = self._decode(self._read)
        after = self._decode()
        if not after.endswith("\ufffd") and len(after) > len(before):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before) :]
        if len(self.ids) - self._read <= self.MAX_PENDING:
            return ""
        return self._release(before, after)

    def _release(self, before: str, after: str) -> str:
        """Emit the waiting ids but the last ``HOLD``: up to the latest split whose text
        ``after`` (the whole window's) starts with, else at ``HOLD`` regardless."""
        last = len(self.ids) - self.HOLD
        split, text = last, ""
        for end in range(last, self._read, -1):
            head = self._decode(end)
            if end == last:
                text = head
            if after.startswith(head) and len(head) >= len(before):
                split, text = end, head
                break
        self._prefix, self._read = self._read, split
        return text[len(before) :]

    def flush(self) -> str:
        """Whatever is left, even an incomplete character (as U+FFFD)."""
        before = self._decode(self._read)
        after = self._decode()
        self._prefix = self._read = len(self.ids)
        return after[len(before) :]
