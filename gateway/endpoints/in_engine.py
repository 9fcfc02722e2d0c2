"""A ``vllm`` endpoint with ``verify = "in-engine"``: the engine speculates by itself with
the gateway's drafts (docs/remote-verification.md, "Drafts inside vLLM").

Every request is relayed like any ``vllm`` request (:class:`HostedEndpoint`: the
tenant's ``cache_salt``, the answer streamed or not as the engine gives it); the gateway
verifies nothing itself. It attaches its drafts as token ids in the body's
``vllm_xargs`` (vLLM's ``SamplingParams.extra_args``): the prediction under
:data:`PREDICTION_KEY`, the tenant's selected documents and latest answers
(:func:`~gateway.endpoints.remote.documents.request_documents`) under
:data:`DOCUMENTS_KEY`, each ended by :data:`SEPARATOR`, at most :data:`MAX_DRAFT_TOKENS`
in all. The ``draftgate-vllm`` plugin in the server's environment (``integrations/vllm``)
joins them to vLLM's own ``ngram`` or ``suffix`` proposals, and vLLM's rejection sampler
keeps what its own decoding produces; a server without the plugin ignores them. Such an
answer says ``X-Draftgate-Prediction: verified-in-engine``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import orjson

from gateway import prediction_policy
from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.endpoints.hosted.endpoint import HostedEndpoint
from gateway.endpoints.remote.documents import request_documents
from gateway.endpoints.remote.prompt import encode, load_tokenizer
from lookup.corpus import Corpus
from sdk.wire import ChatCompletionRequest

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer

log = logging.getLogger(__name__)

VERIFIED_IN_ENGINE = "verified-in-engine"
PREDICTION_KEY = "draftgate_prediction"
DOCUMENTS_KEY = "draftgate_documents"
SEPARATOR = -1  # ends each document; never a token id
MAX_DRAFT_TOKENS = 65536  # drafts one request carries, the prediction's first
_INLINE_CHARS = 4096  # a shorter prediction is tokenized on the event loop


class InEngineEndpoint(HostedEndpoint):
    """The endpoint's relay, with the gateway's drafts in every body it sends."""

    def __init__(
        self,
        config: EndpointConfig,
        environ: Mapping[str, str],
        corpus: Corpus,
        *,
        recent: int = 0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_response_bytes: int,
        capture: bool = False,
    ) -> None:
        super().__init__(
            config,
            environ,
            corpus,
            transport=transport,
            max_response_bytes=max_response_bytes,
            capture=capture,
        )
        self.recent = recent
        self._tokenizer: asyncio.Task[Tokenizer] | None = None

    def start(self) -> None:
        """Load the tokenizer in the background."""
        self._tokenizer = asyncio.create_task(
            asyncio.to_thread(load_tokenizer, self.config.tokenizer or ""),
            name=f"draftgate-tokenizer-{self.config.name}",
        )

    async def aclose(self) -> None:
        if self._tokenizer is not None and not self._tokenizer.done():
            self._tokenizer.cancel()
        await super().aclose()

    async def _prepare(self, call: Call, native: bool) -> tuple[prediction_policy.Decision, bytes]:
        decision, body = await super()._prepare(call, native)
        xargs = await self.drafts(call)
        if not xargs:
            return decision, body
        return prediction_policy.Decision(VERIFIED_IN_ENGINE), with_xargs(body, xargs)

    async def drafts(self, call: Call) -> dict[str, list[int]]:
        """The ``vllm_xargs`` entries carrying ``call``'s drafts (empty: none, drafting
        turned off by the request, or no tokenizer)."""
        request = call.request
        if request.draftgate is not None and not request.draftgate.draft:
            return {}
        tokenizer = await self._loaded_tokenizer()
        if tokenizer is None:
            return {}
        text = ""
        if isinstance(request, ChatCompletionRequest) and request.prediction:
            text = request.prediction.text()
        prediction: list[int] = []
        if text:
            if len(text) > _INLINE_CHARS:
                prediction = await asyncio.to_thread(encode, tokenizer, text)
            else:
                prediction = encode(tokenizer, text)
        documents, _ = await request_documents(
            self.corpus, call, tokenizer, text, self.recent, self.config.name
        )
        return draft_xargs(prediction, [tokens for _, tokens in documents])

    async def _loaded_tokenizer(self) -> Tokenizer | None:
        if self._tokenizer is None:
            self.start()
        assert self._tokenizer is not None
        try:
            return await asyncio.shield(self._tokenizer)
        except Exception as exc:  # an unloadable tokenizer: requests go without drafts
            log.warning("endpoint %s: tokenizer unavailable: %s", self.config.name, exc)
            return None


def draft_xargs(prediction: list[int], documents: list[Any]) -> dict[str, list[int]]:
    """The ``vllm_xargs`` entries for a prediction's and documents' token ids, at most
    :data:`MAX_DRAFT_TOKENS` in all (separators included)."""
    xargs: dict[str, list[int]] = {}
    room = MAX_DRAFT_TOKENS
    if prediction:
        xargs[PREDICTION_KEY] = prediction[:room]
        room -= len(xargs[PREDICTION_KEY])
    joined: list[int] = []
    for tokens in documents:
        if room <= 1:
            break
        part: list[int] = np.asarray(tokens[: room - 1]).tolist()
        joined += [*part, SEPARATOR]
        room -= len(part) + 1
    if joined:
        xargs[DOCUMENTS_KEY] = joined
    return xargs


def with_xargs(body: bytes, xargs: Mapping[str, list[int]]) -> bytes:
    """``body`` (a JSON object) with ``xargs`` added to its ``vllm_xargs`` (the client's
    own entries kept, the draft keys replaced)."""
    head = body.rstrip()[:-1].rstrip()
    if b'"vllm_xargs"' not in body and not head.endswith(b"{"):  # appended, not parsed
        return head + b',"vllm_xargs":' + orjson.dumps(xargs) + b"}"
    data = orjson.loads(body)
    own = data.get("vllm_xargs")
    data["vllm_xargs"] = {**(own if isinstance(own, dict) else {}), **xargs}
    return orjson.dumps(data)
