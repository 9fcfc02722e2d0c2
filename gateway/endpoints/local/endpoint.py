"""The in-process local endpoint: requests submitted to ``local_verifier``'s Engine.

The engine batches every submitted request on its own thread (continuous batching over a
KV pool); the model loads on a one-thread executor. ``local_request`` maps a request's
OpenAI fields onto the engine's, ``local_stream`` carries the engine thread's output to the
event loop and answers with it; when the client goes away the request is cancelled and its
KV blocks are freed at the engine's next step. A full queue is a 503 with ``Retry-After``.
local_verifier is imported lazily, inside functions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from starlette.types import Send

from gateway import prediction_policy
from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.endpoints import response_format
from gateway.endpoints.capabilities import CAPABILITIES, model_extras
from gateway.endpoints.endpoint import CountCall
from gateway.endpoints.local import stream as local_stream
from gateway.endpoints.local import tools
from gateway.endpoints.local.request import (
    OpenAIRequest,
    attach_documents,
    check_fields,
    generation_request,
    invalid,
    requested_max_tokens,
)
from gateway.endpoints.local.stream import Job
from gateway.endpoints.openai_objects import Logprobs
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
)
from gateway.http.asgi import ENDPOINT_HEADER, PREDICTION_HEADER, Headers, send_error
from lookup.corpus import Corpus
from sdk.wire import ChatCompletionRequest

if TYPE_CHECKING:
    from local_verifier.engine import Engine, EngineStats, GenerationRequest, Handle
    from local_verifier.tokenizer import Tokenizer

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1


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
                self._engine.lm.target,
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

    def stats(self) -> EngineStats | None:
        """The loaded engine's counters and memory now (None before it loads)."""
        return None if self._engine is None else self._engine.stats()

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

    async def aclose(self) -> None:
        self.close()

    def capabilities(self) -> dict[str, Any]:
        """What the model honours and its answer length bounds (its ``/v1/models`` extras)."""
        return model_extras(self.config)

    async def count_tokens(self, call: CountCall) -> int:
        """The prompt's tokens exactly: the model's tokenizer and chat template, as a
        generation renders the prompt (tools included)."""
        request = call.request
        engine = await self.engine()
        return len(await asyncio.to_thread(prompt_ids, request, engine.tokenizer))

    # -- request path (event loop) ---------------------------------------------------

    async def serve(self, call: Call, send: Send) -> None:
        """Answer ``call`` (streamed or not) from the local engine."""
        decision = prediction_policy.decide(
            call.request, CAPABILITIES["local"], upstream_model="", doc_ids=call.doc_ids, local=True
        )
        call.timing.prediction_status = decision.status
        headers: Headers = [
            (PREDICTION_HEADER, decision.status.encode()),
            (ENDPOINT_HEADER, self.config.name.encode()),
        ]
        job: Job | None = None
        try:
            n = check_fields(call.request)
            t0 = time.perf_counter()
            engine = await self.engine()
            call.wait.seconds += time.perf_counter() - t0
            plan = self._tools(call.request, engine)
            # the queue first: a request that would be refused costs no document work
            if engine.full:
                raise self._busy()
            gen = await self._generation_request(call, engine, plan)
            job = Job(asyncio.get_running_loop(), n)
            # tokenising the prompt and prediction and compiling the grammar take a while:
            # not on the event loop
            job.handle = await asyncio.to_thread(self._submit, engine, gen, job, plan)
            first = await job.next(call)
            parse = plan is not None and plan.parse
            from local_verifier.events import Failed

            if isinstance(first[1], Failed):
                raise local_stream.failed(first[1].error, self.config.name, parse)
            call.prompt_tokens, call.cached_tokens = job.handle.prompt_tokens()
            logprobs = None
            if gen.logprobs is not None:
                logprobs = Logprobs(call.api, engine.tokenizer.token_bytes)
            answer = local_stream.stream if call.request.stream else local_stream.complete
            await answer(call, job, first, logprobs, send, headers, self.config.name, parse)
        except GatewayError as error:
            call.timing.status = error.status
            call.timing.error = error.message
            await send_error(send, error, headers)
        finally:
            if job is not None and not job.done and job.handle is not None:
                job.handle.cancel()  # the client went away (or the answer failed to send)
                self.stopped += 1

    @staticmethod
    def _tools(request: OpenAIRequest, engine: Engine) -> tools.ToolPlan | None:
        """A chat request's tools, tool choice and tool history for the engine's model."""
        if not isinstance(request, ChatCompletionRequest):
            return None
        text = response_format.grammar_for((request.model_extra or {}).get("response_format"))
        return tools.plan(request, engine.tokenizer.chat_template, text)

    async def _generation_request(
        self, call: Call, engine: Engine, plan: tools.ToolPlan | None
    ) -> GenerationRequest:
        request = call.request
        gen = generation_request(
            request,
            max_tokens=self.config.answer_tokens(requested_max_tokens(request)),
            tenant="" if self.config.share_prefix_cache else call.tenant,
            owner=call.tenant,
            weight=self.weights.get(call.tenant, 1.0),
            tools=plan,
        )
        if gen.draft:
            await attach_documents(
                gen,
                call,
                self.corpus,
                engine.tokenizer,
                recent=self.recent,
                endpoint=self.config.name,
            )
        return gen

    def _submit(
        self, engine: Engine, gen: GenerationRequest, job: Job, plan: tools.ToolPlan | None
    ) -> Handle:
        from local_verifier.errors import EngineBusy, EngineClosed, PromptTooLong, TenantBusy
        from local_verifier.grammar import InvalidGrammar

        try:
            if plan is not None and plan.template:  # the template renders the tools
                gen.prompt_ids, gen.messages = plan.render(engine.tokenizer), None
            return engine.submit_n(gen, job.n, job.push)
        except InvalidGrammar as exc:  # a ValueError: caught first, it names its field
            if plan is not None and plan.grammar is not None:
                raise tools.rejected(plan.tools, exc) from None
            raise response_format.rejected(gen.grammar, exc) from None
        except PromptTooLong as exc:
            raise InvalidRequest(
                str(exc), param="messages", code="context_length_exceeded"
            ) from None
        except ValueError as exc:
            raise invalid(exc) from None
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


def prompt_ids(request: ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids as a generation renders ``request``: the tools by the model's
    template where it renders them, else the engine's messages through the template."""
    plan = tools.plan(request, tokenizer.chat_template, None)
    if plan is not None and plan.template:
        return plan.render(tokenizer)
    messages = plan.messages if plan is not None else tools.chat_messages(request.messages)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
