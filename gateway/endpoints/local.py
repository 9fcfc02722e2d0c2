"""The in-process local endpoint: requests submitted to ``local_verifier``'s Engine.

The engine batches every submitted request on its own thread (continuous batching over a
KV pool); the model loads on a one-thread executor. Deltas cross to the event loop via
``loop.call_soon_threadsafe`` into an ``asyncio.Queue``; when the client goes away the
request is cancelled and its KV blocks are freed at the engine's next step. A full queue
is a 503 with ``Retry-After``. local_verifier is imported lazily, inside functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from starlette.types import Send

from gateway import prediction_policy
from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.endpoints.capabilities import CAPABILITIES
from gateway.endpoints.openai_objects import ChoiceResult, Logprobs, ResponseBuilder, draft_stats
from gateway.endpoints.response_format import grammar_for
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    UpstreamError,
)
from gateway.http.asgi import (
    ENDPOINT_HEADER,
    PREDICTION_HEADER,
    Headers,
    send_body,
    send_error,
)
from gateway.http.sse import DONE_EVENT, SSE_HEADERS, data_event, error_event
from lookup.corpus import Corpus, CorpusError
from lookup.draft import Source
from sdk.wire import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from local_verifier.engine import Engine, GenerationRequest, Handle

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1
MAX_N = 16  # answers per request (each is one running request of the engine)
_PARAMS = (  # sampling fields a ValueError may name
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)
_SOURCES = {"named": Source.DOCUMENT, "retrieved": Source.RETRIEVED, "answer": Source.ANSWER}


# Fields the local engine honours (every other field must be absent or off)
_HONOURED = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stream",
        "stream_options",
        "stop",
        "seed",
        "prediction",
        "draftgate",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "n",
        "logprobs",
        "top_logprobs",
        "response_format",
        # ids and hints for the caller's own records or a provider's routing: nothing to do
        "user",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    }
)
# OpenAI fields the local engine still refuses (a 400 naming them), as /v1/models lists them
UNSUPPORTED_PARAMETERS = (
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "audio",
    "modalities",
    "web_search_options",
    "echo",
    "suffix",
)


def capabilities() -> dict[str, list[str]]:
    """What a local model honours and refuses, for its ``/v1/models`` entry."""
    return {
        "supported_parameters": sorted(_HONOURED),
        "unsupported_parameters": list(UNSUPPORTED_PARAMETERS),
    }


_OFF_VALUES: tuple[Any, ...] = (None, False, "", [], {})


def _is_off(name: str, value: Any) -> bool:
    """True when ``value`` asks for nothing (the field's default or an explicit off)."""
    if any(value is off or (type(value) is type(off) and value == off) for off in _OFF_VALUES):
        return True
    if name == "n":
        return bool(value == 1)
    if name == "tool_choice":  # no tools are accepted, so "none" and "auto" agree
        return value in ("none", "auto")
    return name == "parallel_tool_calls" and isinstance(value, bool)


def _unsupported(request: ChatCompletionRequest | CompletionRequest) -> str | None:
    """The first request field the local engine cannot honour (set to something not off)."""
    given = request.model_fields_set
    fields = {name: getattr(request, name) for name in type(request).model_fields if name in given}
    fields.update(request.model_extra or {})
    chat = isinstance(request, ChatCompletionRequest)
    for name, value in fields.items():
        if chat and name == "tools":
            continue  # _check_tools says why, once the model's template is known
        if name not in _HONOURED and not _is_off(name, value):
            return name
    if isinstance(request, ChatCompletionRequest):
        for message in request.messages:
            parts = message.content if isinstance(message.content, list) else []
            extra = {k for k, v in (message.model_extra or {}).items() if not _is_off(k, v)}
            if extra or any(part.get("type") != "text" for part in parts):
                return "messages"  # images, audio, tool calls and tool results
    else:
        prompt = request.prompt
        if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str):
            return "prompt"
    return None


def _invalid(exc: ValueError) -> InvalidRequest:
    """A 400 for a bad value, naming the sampling field its message starts with."""
    message = str(exc)
    return InvalidRequest(message, param=next((f for f in _PARAMS if message.startswith(f)), None))


def _penalties(request: ChatCompletionRequest | CompletionRequest) -> Any:
    """The request's ``local_verifier`` Penalties (``ValueError`` when a value is bad)."""
    from local_verifier.logits_processors import Penalties

    extra = request.model_extra or {}
    bias = extra.get("logit_bias") or {}
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must map token ids to biases")
    try:
        logit_bias = {int(token): bias[token] for token in bias}
    except ValueError:
        raise ValueError("logit_bias keys must be token ids") from None
    repetition = extra.get("repetition_penalty")
    return Penalties(
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        repetition_penalty=1.0 if repetition is None else repetition,
        logit_bias=logit_bias,
    )


def _top_logprobs(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many alternatives to report per token (None: no logprobs).

    Chat: ``logprobs: true`` with ``top_logprobs`` (0-20); completions: ``logprobs: int``.
    """
    extra = request.model_extra or {}
    if isinstance(request, ChatCompletionRequest):
        top = extra.get("top_logprobs")
        if request.logprobs is not None and not isinstance(request.logprobs, bool):
            raise InvalidRequest("logprobs must be a boolean", param="logprobs")
        if not request.logprobs:
            if top is not None:
                raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        name, value = "top_logprobs", 0 if top is None else top
    else:
        name, value = "logprobs", request.logprobs
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 20:
        raise InvalidRequest(f"{name} must be an integer in [0, 20], got {value!r}", param=name)
    return value


def _check_tools(request: ChatCompletionRequest | CompletionRequest, engine: Engine) -> None:
    """A 400 for ``tools``: parsing tool calls is not implemented for local models, and
    most small models' chat templates (SmolLM2's) cannot even show them to the model."""
    if not isinstance(request, ChatCompletionRequest) or not request.tools:
        return
    reason = (
        "local endpoints do not parse tool calls yet"
        if engine.tokenizer.supports_tools
        else f"the chat template of {engine.name} has no tool support"
    )
    raise InvalidRequest(f"tools: {reason}", param="tools", code="unsupported_parameter")


def _combined(stats: list[Any]) -> Any:
    """One ``GenerationStats`` for ``n`` answers to one prompt: the prompt counted once (its
    cached tokens as answer 0 found them), every answer's output and drafts added up."""
    first = stats[0]
    if len(stats) == 1:
        return first

    def total(name: str) -> Any:
        values = [getattr(s, name) for s in stats]
        return None if all(v is None for v in values) else sum(v or 0 for v in values)

    positions = max(len(s.accepted_by_position) for s in stats)
    sources: dict[str, int] = {}
    for s in stats:
        for source, count in s.accepted_by_source.items():
            sources[source] = sources.get(source, 0) + count
    return dataclasses.replace(
        first,
        completion_tokens=total("completion_tokens"),
        verify_steps=total("verify_steps"),
        drafted_tokens=total("drafted_tokens"),
        accepted_tokens=total("accepted_tokens"),
        accepted_by_position=[
            sum(s.accepted_by_position[i] for s in stats if i < len(s.accepted_by_position))
            for i in range(positions)
        ],
        accepted_by_source=sources,
        accepted_prediction_tokens=total("accepted_prediction_tokens"),
        rejected_prediction_tokens=total("rejected_prediction_tokens"),
        prefill_s=max(s.prefill_s for s in stats),
        total_s=max(s.total_s for s in stats),
    )


class _Job:
    """One request's ``n`` generations: ``(index, item)`` pairs pushed from the engine
    thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.n = n
        self.items: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.handle: Handle | None = None
        self.ended: set[int] = set()  # choices whose engine delivered their last item

    @property
    def done(self) -> bool:
        return len(self.ended) == self.n

    def push(self, index: int, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (index, item))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            if self.handle is not None:
                self.handle.cancel()


class LocalEndpoint:
    """Serves chat/completions requests on a local target model."""

    def __init__(
        self,
        config: EndpointConfig,
        corpus: Corpus,
        *,
        recent: int = 0,
        engine: Engine | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        """``engine``: an already loaded engine to use instead of loading ``config.model``;
        ``weights``: each tenant's share of the engine (1 when not listed)."""
        self.config = config
        self.corpus = corpus
        self.recent = recent
        self.weights = dict(weights or {})
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dg-{config.name}")
        self._engine: Engine | None = engine
        self._owns_engine = engine is None  # a given engine is its owner's to close
        self._load_error: str | None = None
        self._loading: Future[None] | None = None
        self.stopped = 0  # generations stopped early because their client went away

    # -- engine lifecycle (worker thread) -------------------------------------------

    def start(self) -> None:
        """Queue the model load first on the worker thread (returns at once)."""
        if self._loading is None:
            self._loading = self._executor.submit(self._load)

    def _load(self) -> None:
        if self._engine is not None or self._load_error is not None:
            return
        from local_verifier.engine import MAX_BATCH, Engine

        began = time.perf_counter()
        try:
            config = self.config
            self._engine = Engine(
                config.model or "",
                config.device,
                config.dtype,
                kv_cache_mb=config.kv_cache_mb,
                max_queue=config.max_queue,
                max_batch=config.max_batch or MAX_BATCH,
                prefix_cache=config.prefix_cache,
                tenant_places=config.tenant_places
                or ((config.max_batch or MAX_BATCH) + config.max_queue) // 2,
            )
            log.info(
                "local endpoint %s: %s loaded (%s weights) in %.1f s",
                self.config.name,
                self._engine.name,
                str(self._engine.lm.dtype).removeprefix("torch."),
                time.perf_counter() - began,
            )
        except Exception as exc:  # a load failure is reported to every request
            self._load_error = f"{type(exc).__name__}: {exc}"
            log.error("local endpoint %s: %s", self.config.name, self._load_error)

    @property
    def state(self) -> str:
        """``loaded``, ``loading``, ``failed`` or ``idle`` (not asked to load yet)."""
        if self._engine is not None:
            return "loaded"
        if self._load_error is not None:
            return "failed"
        return "idle" if self._loading is None else "loading"

    def memory(self) -> dict[str, int] | None:
        """The loaded engine's memory by part (KV pool reserved and in use...), else None."""
        return None if self._engine is None else self._engine.memory()

    def preemptions(self) -> int:
        """Requests the loaded engine preempted so far (0 before it loads)."""
        return 0 if self._engine is None else self._engine.preemptions

    async def engine(self) -> Engine:
        """The loaded engine (loads it on the worker thread if needed)."""
        if self._engine is None:
            self.start()
            assert self._loading is not None
            await asyncio.wrap_future(self._loading)
        if self._engine is None:  # the reason is in the log
            raise ServiceUnavailable(
                f"local endpoint {self.config.name!r} could not load its model"
            )
        return self._engine

    def close(self) -> None:
        """Stop loading; stop the engine this endpoint loaded (its requests end)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._owns_engine and self._engine is not None:
            self._engine.close()

    # -- request path (event loop) ---------------------------------------------------

    async def _generation_request(self, call: Call, engine: Engine) -> GenerationRequest:
        from local_verifier.engine import GenerationRequest
        from local_verifier.sampling import SamplingParams

        request = call.request
        min_p = (request.model_extra or {}).get("min_p")
        try:
            params = SamplingParams(
                temperature=1.0 if request.temperature is None else request.temperature,
                top_k=request.top_k or 0,
                top_p=1.0 if request.top_p is None else request.top_p,
                seed=request.seed,
                min_p=0.0 if min_p is None else min_p,
            )
            penalties = _penalties(request)
        except ValueError as exc:
            raise _invalid(exc) from None
        draft = request.draftgate is None or request.draftgate.draft
        grammar = grammar_for((request.model_extra or {}).get("response_format"))
        gen = GenerationRequest(
            params=params,
            max_tokens=self.config.answer_tokens(
                request.max_completion_tokens or request.max_tokens
                if isinstance(request, ChatCompletionRequest)
                else request.max_tokens
            ),
            stop=request.stop_list(),
            draft=draft,
            max_draft=request.draftgate.max_draft_tokens if request.draftgate else None,
            tenant="" if self.config.share_prefix_cache else call.tenant,
            owner=call.tenant,
            weight=self.weights.get(call.tenant, 1.0),
            penalties=penalties,
            logprobs=_top_logprobs(request),
            grammar=grammar,
        )
        if isinstance(request, ChatCompletionRequest):
            gen.messages = [{"role": m.role, "content": m.text()} for m in request.messages]
            gen.prediction = request.prediction.text() if request.prediction else None
        elif isinstance(request.prompt, str):
            gen.prompt = request.prompt
        elif request.prompt and isinstance(request.prompt[0], str):
            gen.prompt = str(request.prompt[0])
        else:
            gen.prompt_ids = [int(t) for t in request.prompt]
        if draft:
            await self._documents(call, engine, gen)
        return gen

    async def _documents(self, call: Call, engine: Engine, gen: GenerationRequest) -> None:
        """Named, recent and retrieved documents' tokens and sources into ``gen`` (the corpus
        scans the prompt for mentions and tokenizes on worker threads, not on the event
        loop)."""
        try:
            docs = await self.corpus.select(
                call.tenant,
                ids=call.doc_ids,
                prompt_text=call.prompt_text(),
                prediction_text=gen.prediction or "",
                recent=self.recent,
            )
            if not docs:
                return
            tokenizer = engine.tokenizer
            gen.documents = await self.corpus.tokens(
                call.tenant, docs, tokenizer.fingerprint, tokenizer.encode
            )
            gen.document_sources = [_SOURCES[d.kind] for d in docs]
        except CorpusError as exc:
            log.warning("local endpoint %s: documents unavailable: %s", self.config.name, exc)

    async def serve(self, call: Call, send: Send) -> None:
        """Answer ``call`` (streamed or not) from the local engine."""
        field = _unsupported(call.request)
        decision = prediction_policy.decide(
            call.request, CAPABILITIES["local"], upstream_model="", doc_ids=call.doc_ids, local=True
        )
        call.timing.prediction_status = decision.status
        headers: Headers = [
            (PREDICTION_HEADER, decision.status.encode()),
            (ENDPOINT_HEADER, self.config.name.encode()),
        ]
        job: _Job | None = None
        try:
            if field is not None:
                raise InvalidRequest(
                    f"{field}: not supported by local endpoints",
                    param=field,
                    code="unsupported_parameter",
                )
            n = call.request.n or 1
            if n > MAX_N:
                raise InvalidRequest(f"n must be at most {MAX_N} on local endpoints", param="n")
            t0 = time.perf_counter()
            engine = await self.engine()
            call.wait.seconds += time.perf_counter() - t0
            _check_tools(call.request, engine)
            # the queue first: a request that would be refused costs no document work
            if engine.full:
                raise self._busy()
            gen = await self._generation_request(call, engine)
            job = _Job(asyncio.get_running_loop(), n)
            # tokenising the prompt and prediction takes a while: not on the event loop
            job.handle = await asyncio.to_thread(self._submit, engine, gen, job)
            first = await self._next(job, call)
            if isinstance(first[1], Exception):
                raise _failed(first[1], self.config.name)
            logprobs = Logprobs(call.api, engine.tokenizer.token_bytes)
            if call.request.stream:
                await self._stream(call, job, first, logprobs, send, headers)
            else:
                await self._complete(call, job, first, logprobs, send, headers)
        except GatewayError as error:
            call.timing.status = error.status
            call.timing.error = error.message
            await send_error(send, error, headers)
        finally:
            if job is not None and not job.done and job.handle is not None:
                job.handle.cancel()  # the client went away (or the answer failed to send)
                self.stopped += 1

    def _submit(self, engine: Engine, gen: GenerationRequest, job: _Job) -> Handle:
        from local_verifier.errors import EngineBusy, EngineClosed, PromptTooLong, TenantBusy

        try:
            return engine.submit_n(gen, job.n, job.push)
        except PromptTooLong as exc:
            raise InvalidRequest(
                str(exc), param="messages", code="context_length_exceeded"
            ) from None
        except ValueError as exc:
            raise _invalid(exc) from None
        except TenantBusy as exc:  # this tenant's share is taken; others are still served
            raise RateLimited(
                f"local endpoint {self.config.name!r}: {exc}; try again",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None
        except EngineBusy:
            raise self._busy() from None
        except EngineClosed:  # the gateway is shutting down
            raise ServiceUnavailable(
                f"local endpoint {self.config.name!r} is shutting down",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            ) from None

    def _busy(self) -> ServiceUnavailable:
        return ServiceUnavailable(
            f"local endpoint {self.config.name!r} is full (its queue holds "
            f"{self.config.max_queue} requests); try again",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    async def _next(self, job: _Job, call: Call) -> tuple[int, Any]:
        """The next ``(choice index, item)``."""
        from local_verifier.engine import END, GenerationStats

        t0 = time.perf_counter()
        index, item = await job.items.get()
        call.wait.seconds += time.perf_counter() - t0
        if item is END or isinstance(item, GenerationStats | Exception):
            job.ended.add(index)  # nothing but END follows
        return index, item

    def _note_delta(self, call: Call, delta: Any) -> None:
        now = time.perf_counter()
        timing = call.timing
        if timing.t_first_byte is None:
            timing.t_first_byte = now
        if delta.text and timing.t_first_content is None:
            timing.t_first_content = now
        timing.chunk_times.append(now)
        timing.chunk_tokens.append(len(delta.token_ids))

    def _note_stats(self, call: Call, stats: Any) -> None:
        timing = call.timing
        timing.t_end = time.perf_counter()
        timing.output_tokens = stats.completion_tokens
        timing.prompt_tokens = stats.prompt_tokens
        timing.cached_tokens = stats.cached_tokens
        timing.accepted_prediction_tokens = stats.accepted_prediction_tokens
        timing.rejected_prediction_tokens = stats.rejected_prediction_tokens

    async def _complete(
        self,
        call: Call,
        job: _Job,
        first: tuple[int, Any],
        logprobs: Logprobs,
        send: Send,
        headers: Headers,
    ) -> None:
        from local_verifier.engine import END, GenerationStats

        n = job.n
        texts: list[list[str]] = [[] for _ in range(n)]
        wanted = _top_logprobs(call.request) is not None
        tokens: list[list[Any]] = [[] for _ in range(n)]
        stats: dict[int, Any] = {}
        index, item = first
        while len(stats) < n:
            if isinstance(item, Exception):
                raise _failed(item, self.config.name)
            if item is END:
                if index not in stats:
                    raise UpstreamError("local generation ended without statistics")
            elif isinstance(item, GenerationStats):
                stats[index] = item
            else:
                self._note_delta(call, item)
                texts[index].append(item.text)
                tokens[index] += item.logprobs or []
            if len(stats) < n:
                index, item = await self._next(job, call)
        total = _combined([stats[i] for i in range(n)])
        self._note_stats(call, total)
        choices = [
            ChoiceResult(
                "".join(texts[i]),
                stats[i].finish_reason,
                logprobs.format(tokens[i], i) if wanted else None,
            )
            for i in range(n)
        ]
        body = ResponseBuilder(call.api, call.request.model).complete(choices, total)
        call.response_text = [c.text for c in choices]
        await send_body(
            send,
            200,
            json.dumps(body, ensure_ascii=False).encode(),
            [(b"content-type", b"application/json"), *headers],
        )

    async def _stream(
        self,
        call: Call,
        job: _Job,
        first: tuple[int, Any],
        logprobs: Logprobs,
        send: Send,
        headers: Headers,
    ) -> None:
        from local_verifier.engine import END, GenerationStats

        builder = ResponseBuilder(call.api, call.request.model)
        include_usage = bool(
            call.request.stream_options and call.request.stream_options.include_usage
        )
        await send(
            {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]}
        )

        async def emit(body: bytes) -> None:
            await send({"type": "http.response.body", "body": body, "more_body": True})

        n = job.n
        if call.api == "chat":
            for i in range(n):
                await emit(data_event(builder.chunk(role=True, index=i)))
        texts: list[list[str]] = [[] for _ in range(n)]
        stats: dict[int, Any] = {}
        index, item = first
        while True:
            if isinstance(item, Exception):
                error = _failed(item, self.config.name)
                call.timing.status = 500
                call.timing.error = error.message
                await emit(error_event(error.message, "server_error", "generation_failed"))
                break
            if isinstance(item, GenerationStats):
                stats[index] = item
                final = builder.chunk(finish=item.finish_reason, index=index)
                final["draftgate"] = draft_stats(item)
                await emit(data_event(final))
            elif item is not END:
                if item.text or item.logprobs:
                    lp = logprobs.format(item.logprobs, index) if item.logprobs else None
                    await emit(data_event(builder.chunk(item.text, index=index, logprobs=lp)))
                    texts[index].append(item.text)
                self._note_delta(call, item)
            if len(stats) == n:
                total = _combined([stats[i] for i in range(n)])
                self._note_stats(call, total)
                if include_usage:
                    await emit(data_event(builder.usage_chunk(total)))
                await emit(DONE_EVENT)
                call.response_text = ["".join(t) for t in texts]
                break
            if job.done:  # every choice ended, not all with statistics
                break
            index, item = await self._next(job, call)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _failed(exc: Exception, endpoint: str) -> UpstreamError:
    """A generation failure: its detail goes to the log, a generic message to the client."""
    log.error("local endpoint %s: generation failed", endpoint, exc_info=exc)
    return UpstreamError("local generation failed", code="generation_failed")
