"""An endpoint reached over HTTP with OpenAI's wire (a hosted provider, a self-hosted
engine, a ``draftgate verifier``): the request relayed, the answer forwarded as it comes.

The prediction policy (:mod:`gateway.prediction_policy`, with the kind's capability)
decides whether the prediction is passed, dropped or synthesized from named documents;
the body is rewritten only when something must change. A request whose front-door API
the kind speaks itself (its ``native_apis``) is relayed as the client sent it, to that
API's path, and marked native so the door does not transcode the answer; every other
request goes as the internal OpenAI request. Failures before the first byte are
retried by :class:`~gateway.endpoints.hosted.upstream.Upstream`, then raised as
:class:`~gateway.endpoints.endpoint.Unavailable` (the next endpoint is tried) unless
the client's request was at fault. A count of a Messages request's tokens is asked of a
kind whose API counts them (``counts_tokens``), relayed as the client sent it; every other
kind has no tokenizer here and answers the gateway's estimate.

A vLLM or SGLang engine serves every tenant from one prefix cache: each request carries
its tenant's ``cache_salt`` (:class:`~gateway.endpoints.cache_salt.CacheSalts`; vLLM
keys its prefix cache with it, SGLang joins it with ``extra_key`` into its radix cache's
namespace), and the engine's cached-token counts are removed from the answer, so no
tenant can time or count another's prompts through the cache.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from starlette.types import Send

from gateway import prediction_policy
from gateway.call import API_PATHS, Call
from gateway.config import EndpointConfig
from gateway.endpoints.cache_salt import CacheSalts
from gateway.endpoints.capabilities import model_extras
from gateway.endpoints.endpoint import CountCall, Relayed, Served, Unavailable
from gateway.endpoints.hosted.relay import fail, relay_body, relay_stream
from gateway.endpoints.hosted.upstream import Upstream, UpstreamFailure
from gateway.errors import UpstreamError
from gateway.http.asgi import ENDPOINT_HEADER, PREDICTION_HEADER, Headers
from gateway.provider_table import PROVIDERS
from lookup.corpus import Corpus, CorpusError

# kinds whose OpenAI API takes ``cache_salt`` and shares one prefix cache among requests
SALTED_KINDS = frozenset({"vllm", "sglang"})
COUNT_TOKENS_PATH = "messages/count_tokens"
MAX_COUNT_BYTES = 64 * 1024  # a count is a few bytes; a longer answer is no count


class HostedEndpoint:
    """One HTTP upstream behind the OpenAI routes (and the front doors it speaks)."""

    def __init__(
        self,
        config: EndpointConfig,
        environ: Mapping[str, str],
        corpus: Corpus,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_response_bytes: int,
        capture: bool = False,
    ) -> None:
        self.config = config
        self.upstream = Upstream(config, environ, transport)
        self.corpus = corpus
        self.max_response_bytes = max_response_bytes
        self.capture = capture
        self.provider = PROVIDERS[config.kind]
        # one salt per tenant; a verify endpoint hands its relay remote verification's
        self.salts: CacheSalts | None = CacheSalts() if config.kind in SALTED_KINDS else None

    def start(self) -> None:
        """Nothing runs in the background (health checks are the runtime's)."""

    def capabilities(self) -> dict[str, Any]:
        return model_extras(self.config)

    async def aclose(self) -> None:
        await self.upstream.aclose()

    async def serve(
        self, call: Call, send: Send, extra: Sequence[tuple[bytes, bytes]] = ()
    ) -> Served | None:
        """Relay ``call``; ``extra`` headers go on the answer."""
        config = self.config
        native = call.api in self.provider.native_apis
        decision, body = await self._prepare(call, native)
        call.timing.prediction_status = decision.status
        t0 = time.perf_counter()
        try:
            response = await self.upstream.open(
                API_PATHS[call.api if native else call.openai_api],
                body,
                config.upstream_model(call.request.model),
                call.forward_headers,
                retry=call.tries_left == 0,
            )
        except UpstreamFailure as exc:
            if exc.client_fault:
                await fail(call, send, exc.to_error(config.name), extra)
                return None
            error = exc.to_error(config.name)
            raise Unavailable(error, endpoint_fault=exc.endpoint_fault) from None
        finally:
            call.wait.seconds += time.perf_counter() - t0
        call.timing.t_first_byte = time.perf_counter()
        call.native = native
        headers: Headers = [
            (PREDICTION_HEADER, decision.status.encode()),
            (ENDPOINT_HEADER, config.name.encode()),
            *extra,
        ]
        if call.request.stream:
            await relay_stream(
                call,
                response,
                send,
                headers,
                capture=self.capture,
                private_cache=self.salts is not None,
            )
        else:
            await relay_body(
                call,
                response,
                send,
                headers,
                limit=self.max_response_bytes,
                capture=self.capture,
                private_cache=self.salts is not None,
            )
        return Served(call.timing.error is None, time.perf_counter() - t0)

    async def count_tokens(self, call: CountCall) -> int | Relayed:
        """The provider's own count where its API counts tokens, else ``call.estimate``."""
        if not self.provider.counts_tokens:
            return call.estimate
        config = self.config
        model = config.upstream_model(call.request.model)
        body = await prediction_policy.upstream_body(
            call.raw, call.data, upstream_model=model, strip_prediction=False, prediction_text=None
        )
        try:
            response = await self.upstream.open(COUNT_TOKENS_PATH, body, model)
        except UpstreamFailure as exc:
            raise exc.to_error(config.name) from None
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_COUNT_BYTES:
                    raise UpstreamError(f"endpoint {config.name!r} answered no token count")
                chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream body interrupted: {type(exc).__name__}") from None
        finally:
            await response.aclose()
        return Relayed(response.status_code, b"".join(chunks))

    async def _prepare(self, call: Call, native: bool) -> tuple[prediction_policy.Decision, bytes]:
        config = self.config
        upstream_model = config.upstream_model(call.request.model)
        if native:  # the client's own API: only the model is renamed, the answer capped
            body = await prediction_policy.upstream_body(
                call.raw,
                call.data,
                upstream_model=upstream_model,
                strip_prediction=False,
                prediction_text=None,
                max_tokens_cap=config.max_tokens_cap,
            )
            return prediction_policy.Decision(prediction_policy.NONE), body
        raw, data = call.openai_body()
        decision = prediction_policy.decide(
            call.request,
            self.provider.capability,
            upstream_model=upstream_model,
            doc_ids=call.doc_ids,
            accepts_override=config.accepts_prediction,
            api_version=config.api_version,
        )
        prediction_text = None
        if decision.synthesize:
            prediction_text, missing = await document_text(self.corpus, call.tenant, call.doc_ids)
            if prediction_text is None:
                decision = prediction_policy.Decision(prediction_policy.dropped(missing))
        body = await prediction_policy.upstream_body(
            raw,
            data,
            upstream_model=upstream_model,
            strip_prediction=decision.strip_prediction,
            prediction_text=prediction_text,
            cache_salt=self.salts(call.tenant) if self.salts is not None else None,
            max_tokens_cap=config.max_tokens_cap,
        )
        return decision, body


async def document_text(corpus: Corpus, tenant: str, ids: list[str]) -> tuple[str | None, str]:
    """The named documents' text joined (for a synthesized prediction), or ``None`` and the
    reason (``no-document`` / ``store-unavailable``)."""
    try:
        docs = await corpus.select(tenant, ids=ids)
    except CorpusError:
        return None, "store-unavailable"
    wanted = set(ids)
    found = [d.text for d in docs if d.id in wanted]
    if not found:
        return None, "no-document"
    return "\n".join(found), ""
