"""One request's prompt, prediction and drafter, built on a worker thread (a prompt of
megabytes takes seconds to template and tokenize), the cheap bound that refuses a
prompt no engine context can hold before any of that work, and the endpoint's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gateway.endpoints.remote.context import TokenIds
from lookup.agent_sources import conversation_documents
from lookup.draft import Source
from lookup.drafter import Drafter
from lookup.index import IndexCache
from sdk.wire import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer


@dataclass
class Prepared:
    """What the verify loop starts from."""

    context: TokenIds  # the prompt's ids (then the answer's, as they are committed)
    predicted: bool
    drafter: Drafter


def encode(tokenizer: Tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """``Tokenizer.encode``'s ids through the backend's batch call, which lets the GIL go
    while it works (its single-text call holds it, stalling the event loop's thread)."""
    ids: list[int] = tokenizer.backend.encode_batch([text], add_special_tokens=False)[0].ids
    if add_special_tokens and tokenizer.add_bos and tokenizer.bos_id is not None:
        return [tokenizer.bos_id, *ids]
    return ids


def max_token_chars(tokenizer: Tokenizer) -> int:
    """The most characters one token of the vocabulary spells (byte-level vocabularies
    spell each byte as one character, so this bounds a token's text from above)."""
    return max((len(t) for t in tokenizer.backend.get_vocab(with_added_tokens=True)), default=1)


def cannot_fit(
    request: ChatCompletionRequest | CompletionRequest, max_model_len: int, token_chars: int
) -> bool:
    """Whether the request's text alone takes more tokens than ``max_model_len`` (each
    token spells at most ``token_chars`` characters), without tokenizing it."""
    if isinstance(request, ChatCompletionRequest):
        chars = sum(len(m.text()) for m in request.messages)
    else:
        prompt = request.prompt
        chars = len(prompt) if isinstance(prompt, str) else 0
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            chars = len(prompt[0])
    return chars > max_model_len * token_chars


def prompt_ids(
    request: ChatCompletionRequest | CompletionRequest, tokenizer: Tokenizer
) -> list[int]:
    """The token ids the engine is asked to continue (``ValueError``: none)."""
    if isinstance(request, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return encode(tokenizer, text)
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = encode(tokenizer, prompt, add_special_tokens=True)
    else:
        ids = [int(t) for t in prompt]
        if any(not 0 <= t < tokenizer.vocab_size for t in ids):
            raise ValueError("a prompt token id outside the vocabulary")
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


def prepare(
    request: ChatCompletionRequest | CompletionRequest,
    tokenizer: Tokenizer,
    prediction_text: str,
    documents: Sequence[tuple[str, np.ndarray]],
    sources: Sequence[Source],
    index_cache: IndexCache,
) -> Prepared:
    """The prompt's ids, the prediction's and the drafter over them, the documents and the
    files the conversation shows, in the forms an edit writes them (run on a worker thread)."""
    ids = prompt_ids(request, tokenizer)
    prediction = encode(tokenizer, prediction_text) if prediction_text else None
    if isinstance(request, ChatCompletionRequest):
        shown = conversation_documents(
            [{"role": m.role, "content": m.text()} for m in request.messages],
            lambda text: encode(tokenizer, text),
            tokenizer.fingerprint,
        )
        documents = [*documents, *shown]
        sources = [*sources, *[Source.CONVERSATION] * len(shown)]
    indexes = [index_cache.get_or_build(key, tokens) for key, tokens in documents]
    drafter = Drafter(ids, prediction, indexes, document_sources=sources)
    return Prepared(TokenIds(ids), prediction is not None, drafter)


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer of a .gguf file, a Hugging Face directory (or its tokenizer.json), or
    the smollm2-135m alias."""
    from local_verifier.gguf_file import GGUFFile
    from local_verifier.gguf_loader import read_tokenizer as gguf_tokenizer
    from local_verifier.hf_loader import read_tokenizer as hf_tokenizer
    from local_verifier.loader import resolve_spec

    path, _ = resolve_spec(spec)
    if path.suffix == ".gguf":
        return gguf_tokenizer(GGUFFile(path))
    return hf_tokenizer(path if path.is_dir() else Path(path).parent)
