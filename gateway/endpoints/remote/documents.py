"""The tenant's documents one request drafts from, as token arrays: the named ones, those
its prompt mentions, the latest captured answers and those retrieved by content
(:meth:`lookup.corpus.Corpus.select`), tokenized once per tokenizer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gateway.call import Call
from gateway.endpoints.remote.prompt import encode
from lookup.corpus import Corpus, CorpusError
from lookup.draft import Source

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer

log = logging.getLogger(__name__)

SOURCES = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}


async def request_documents(
    corpus: Corpus,
    call: Call,
    tokenizer: Tokenizer,
    prediction_text: str,
    recent: int,
    endpoint: str,
) -> tuple[list[tuple[str, Any]], list[Source]]:
    """The selected documents' (content sha256, token ids) and their sources; none when
    the store cannot be read (logged with the ``endpoint``'s name)."""
    try:
        docs = await corpus.select(
            call.tenant,
            ids=call.doc_ids,
            prompt_text=call.prompt_text(),
            prediction_text=prediction_text,
            recent=recent,
        )
        if not docs:
            return [], []
        tokens = await corpus.tokens(
            call.tenant, docs, tokenizer.fingerprint, lambda text: encode(tokenizer, text)
        )
    except CorpusError as exc:
        log.warning("endpoint %s: documents unavailable: %s", endpoint, exc)
        return [], []
    return tokens, [SOURCES[d.kind] for d in docs]
