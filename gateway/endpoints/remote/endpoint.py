"""An ``sglang`` or ``vllm`` endpoint whose greedy answers the gateway drafts and the
engine verifies over its own API (``verify = "remote"``; docs/remote-verification.md).

:meth:`RemoteEndpoint.serve` answers a request itself, or returns why it passes through
(the reason goes to the ``X-Draftgate-Remote-Verify`` header of the proxied answer):
verification is not enabled (the self-test has not found the engine exact, or found it
only approximate without ``remote-approximate``), the request samples, asks for fields
only the engine's OpenAI API implements, the prompt cannot fit the engine's context, or
drafts cannot pay (then, and after a failed self-test, a self-test runs again in the
background at most once a :data:`REMEASURE_S`, so neither verdict is final).
Templating, tokenizing and indexing run on a worker thread; the answer is bounded by the
endpoint's ``max_tokens_cap``. The
engine's prefix cache is salted per tenant, and no cached-token count reaches a caller
(it would tell one tenant what others sent). The tokenizer is loaded with
``local_verifier`` (imported lazily, like the local endpoints do).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from starlette.types import Send

from gateway.call import Call
from gateway.config import EndpointConfig
from gateway.endpoints.cache_salt import CacheSalts
from gateway.endpoints.local.request import requested_max_tokens, unsupported
from gateway.endpoints.openai_objects import ChoiceResult, ResponseBuilder, draft_stats
from gateway.endpoints.providers import adapter_for
from gateway.endpoints.remote.documents import request_documents
from gateway.endpoints.remote.failures import RemoteFailure
from gateway.endpoints.remote.prompt import (
    cannot_fit,
    load_tokenizer,
    max_token_chars,
    prepare,
)
from gateway.endpoints.remote.selftest import SelfTest, run_self_test
from gateway.endpoints.remote.verify import (
    MAX_DRAFT,
    LoopStats,
    Pacing,
    VerifyLoop,
)
from gateway.endpoints.remote.wire import Ask, EngineClient, engine_client
from gateway.http.asgi import ENDPOINT_HEADER, PREDICTION_HEADER, Headers, send_body
from gateway.http.sse import DONE_EVENT, SSE_HEADERS, data_event, error_event
from gateway.records.probes import server_root
from lookup.corpus import Corpus
from lookup.index import IndexCache
from sdk.wire import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from local_verifier.tokenizer import Tokenizer

log = logging.getLogger(__name__)

REMOTE_VERIFY_HEADER = b"x-draftgate-remote-verify"
VERIFIED = b"verified-remotely"
REMEASURE_S = 60.0  # while drafts do not pay, the costs are measured again this often
_FIELD = re.compile(r"^[a-z][a-z0-9_]{0,39}$")  # a field name fit for a header value
# fields the local endpoints honour that the verify path does not (sampling, logprobs,
# structured output, tools): a request setting one passes through to the engine's own API
_LOCAL_ONLY = (
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
)
_OFF: tuple[Any, ...] = (None, False, 0, "", [], {})


def passthrough_reason(request: ChatCompletionRequest | CompletionRequest) -> str | None:
    """Why ``request`` cannot be verified remotely (None: it can)."""
    if request.temperature != 0 or request.top_p not in (None, 1):
        return "sampled"
    field = unsupported(request)  # what even a local endpoint refuses
    if field is None:
        given = {name: getattr(request, name) for name in request.model_fields_set}
        given.update(request.model_extra or {})
        field = next((f for f in _LOCAL_ONLY if given.get(f) not in _OFF), None)
    if field is None and (request.n or 1) != 1:
        field = "n"
    if field is not None:
        return f"unsupported:{field if _FIELD.match(field) else 'unknown-field'}"
    if request.draftgate is not None and not request.draftgate.draft:
        return "draft-off"
    return None


@dataclass
class AnswerStats:
    """One answer's counters in the shape ``openai_objects.usage``/``draft_stats`` read."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None
    verify_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    prefill_s: float = 0.0
    total_s: float = 0.0
    preemptions: int = 0  # the server's scheduling is its own: never counted here


def remote_stats(loop: LoopStats) -> dict[str, Any]:
    """draftgate's ``remote`` object: round trips and recoveries (no cached-token counts:
    they would tell a caller what the engine's cache holds)."""
    return {
        "round_trips": loop.round_trips,
        "scoring_rounds": loop.rounds,
        "scoring_requests": loop.score_requests,
        "plain_decodes": loop.decodes,
        "near_ties": loop.near_ties,
        "recovered": loop.recovered,
    }


class RemoteEndpoint:
    """Remote verification in front of one sglang/vllm endpoint."""

    def __init__(
        self,
        config: EndpointConfig,
        corpus: Corpus,
        environ: Mapping[str, str],
        *,
        recent: int = 0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.corpus = corpus
        self.recent = recent
        adapter = adapter_for(config, environ)
        headers = {k.decode(): v.decode() for k, v in adapter.auth_headers()}
        self.client: EngineClient = engine_client(
            config.kind,
            server_root(config.base_url or ""),
            headers,
            config.timeout_s,
            config.connect_timeout_s,
            transport,
        )
        self.pacing = Pacing.configured(config.verify_round_trip_s, config.verify_token_s)
        self.index_cache = IndexCache()
        self.salts = CacheSalts()
        self.self_test: SelfTest | None = None
        self.remeasure_s = REMEASURE_S
        self._tokenizer: Tokenizer | None = None
        self._token_chars = 1  # the most characters one token spells
        self._task: asyncio.Task[None] | None = None
        self._remeasure: asyncio.Task[SelfTest] | None = None
        self._on_result: Any = None
        self._notes: list[str] = []  # the client's notes already logged
        self.checked = threading.Event()  # set once a self-test has finished

    # -- lifecycle ---------------------------------------------------------------------

    async def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            tokenizer = await asyncio.to_thread(load_tokenizer, self.config.tokenizer or "")
            self._token_chars = await asyncio.to_thread(max_token_chars, tokenizer)
            self._tokenizer = tokenizer
        return self._tokenizer

    def start(self, on_result: Any = None) -> None:
        """Run the self-test now and every ``verify_check_interval_s`` (in the background);
        ``on_result(endpoint_name, SelfTest)`` is awaited after each."""
        self._on_result = on_result
        if self._task is None:
            self._task = asyncio.create_task(
                self._checking(on_result), name=f"draftgate-verify-{self.config.name}"
            )

    async def _checking(self, on_result: Any) -> None:
        while True:
            await self.check(on_result)
            if self.config.verify_check_interval_s <= 0:
                return
            await asyncio.sleep(self.config.verify_check_interval_s)

    async def check(self, on_result: Any = None) -> SelfTest:
        """One self-test; its result decides whether verification runs."""
        self.pacing.remeasure()
        try:
            result = await run_self_test(self.client, await self.tokenizer(), self.pacing)
        except RemoteFailure as exc:  # the server is unreachable or refused
            log.warning("endpoint %s: remote verify self-test failed: %s", self.config.name, exc)
            result = SelfTest.failed(str(exc))
        except Exception as exc:  # an unloadable tokenizer
            log.warning("endpoint %s: remote verify self-test failed: %s", self.config.name, exc)
            result = SelfTest.failed(f"{type(exc).__name__}")
        self.self_test = result
        self.checked.set()
        log.info("endpoint %s: remote verify self-test: %s", self.config.name, result.detail)
        if on_result is not None:
            await on_result(self.config.name, result)
        return result

    @property
    def enabled(self) -> bool:
        test = self.self_test
        if test is None:
            return False
        if test.state == "exact":
            return True
        return test.state == "approximate" and self.config.verify == "remote-approximate"

    async def aclose(self) -> None:
        for task in (self._task, self._remeasure):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.client.aclose()

    def _measure_again(self) -> None:
        """Run a self-test in the background unless one ran within ``remeasure_s``: a
        measured "does not pay" or a failed self-test is not final."""
        test = self.self_test
        if self._remeasure is not None and not self._remeasure.done():
            return
        if test is not None and time.time() - test.at < self.remeasure_s:
            return
        self._remeasure = asyncio.create_task(
            self.check(self._on_result), name=f"draftgate-remeasure-{self.config.name}"
        )

    def _log_notes(self) -> None:
        """What the client learned about the engine mid-traffic, logged once each."""
        for note in self.client.notes():
            if note not in self._notes:
                self._notes.append(note)
                log.warning("endpoint %s: %s", self.config.name, note)

    # -- requests ----------------------------------------------------------------------

    async def serve(self, call: Call, send: Send) -> str | None:
        """Answer ``call`` by remote verification, or return why it passes through (then
        nothing was sent)."""
        request = call.request
        if not self.enabled:
            if self.self_test is None:
                return "not-enabled"
            if self.self_test.state == "failed":
                self._measure_again()
            return f"self-test:{self.self_test.state}"
        reason = passthrough_reason(request)
        if reason is not None:
            return reason
        if not self.pacing.pays(MAX_DRAFT + 1):
            if not (self.pacing.pinned_round_trip and self.pacing.pinned_token):
                self._measure_again()
            return "does-not-pay"
        tokenizer = await self.tokenizer()
        limit = self.client.max_model_len
        if limit is not None and cannot_fit(request, limit, self._token_chars):
            return "prompt-too-long"
        prediction_text = (
            request.prediction.text()
            if isinstance(request, ChatCompletionRequest) and request.prediction
            else ""
        )
        documents, sources = await request_documents(
            self.corpus, call, tokenizer, prediction_text, self.recent, self.config.name
        )
        try:
            prepared = await asyncio.to_thread(
                prepare, request, tokenizer, prediction_text, documents, sources, self.index_cache
            )
        except ValueError:
            return "unsupported:prompt"
        if limit is not None and len(prepared.context) >= limit:
            return "prompt-too-long"
        loop = VerifyLoop(
            self.client,
            prepared.context,
            prepared.drafter,
            self.config.answer_tokens(requested_max_tokens(request)),
            self.pacing,
            tokenizer.eos_ids,
            Ask(tokenizer.vocab_size, self.salts(call.tenant)),
        )
        answer = _Answer(call, loop, tokenizer, request.stop_list(), prepared.predicted)
        try:
            if not await answer.first():
                return "failed-before-output"
            call.timing.prediction_status = VERIFIED.decode()
            call.prompt_tokens = loop.prompt_tokens  # no cached count reaches a caller
            headers: Headers = [
                (PREDICTION_HEADER, VERIFIED),
                (ENDPOINT_HEADER, self.config.name.encode()),
            ]
            if request.stream:
                await answer.stream(send, headers)
            else:
                await answer.complete(send, headers)
        finally:
            self._log_notes()
        return None


class _Answer:
    """One verified answer on its way to the client: committed tokens become text
    (``local_verifier``'s output assembler: EOS, stop strings, max tokens)."""

    def __init__(
        self, call: Call, loop: VerifyLoop, tokenizer: Tokenizer, stop: list[str], predicted: bool
    ) -> None:
        from local_verifier.output import OutputAssembler

        self.call = call
        self.loop = loop
        self.predicted = predicted
        self.output = OutputAssembler(tokenizer, stop, loop.budget)
        self.tokens = loop.tokens()
        self.pending: list[int] | None = None
        self.t0 = time.perf_counter()

    async def first(self) -> bool:
        """Wait for the first committed tokens; False when the engine failed before any."""
        try:
            self.pending = await anext(self.tokens)
        except StopAsyncIteration:
            self.pending = []
        except RemoteFailure as exc:
            log.warning("remote verify failed before any output: %s", exc)
            await self.tokens.aclose()
            return False
        return True

    async def texts(self) -> Any:
        """Text deltas until the output ends (``RemoteFailure`` when the engine is gone)."""
        timing = self.call.timing
        try:
            batch = self.pending or []
            while True:
                delta = self.output.push(batch)
                now = time.perf_counter()
                if timing.t_first_byte is None:
                    timing.t_first_byte = now
                timing.chunk_times.append(now)
                timing.chunk_tokens.append(len(delta.token_ids))
                if delta.text:
                    if timing.t_first_content is None:
                        timing.t_first_content = now
                    yield delta.text
                if self.output.finish_reason is not None:
                    break
                try:
                    batch = await anext(self.tokens)
                except StopAsyncIteration:
                    break
            tail = self.output.finish()
            if tail.text:
                yield tail.text
        finally:
            await self.tokens.aclose()

    def stats(self) -> AnswerStats:
        loop = self.loop
        drafter = loop.drafter
        accepted, rejected = (
            drafter.prediction_usage() if self.predicted and drafter is not None else (None, None)
        )
        s = loop.stats
        stats = AnswerStats(
            prompt_tokens=loop.prompt_tokens,
            completion_tokens=len(self.output.token_ids),
            accepted_prediction_tokens=accepted,
            rejected_prediction_tokens=rejected,
            verify_steps=s.rounds,
            drafted_tokens=s.drafted,
            accepted_tokens=s.accepted,
            accepted_by_position=list(s.accepted_by_position),
            total_s=time.perf_counter() - self.t0,
        )
        timing = self.call.timing
        timing.t_end = time.perf_counter()
        timing.output_tokens = stats.completion_tokens
        timing.prompt_tokens = stats.prompt_tokens
        timing.cached_tokens = stats.cached_tokens
        timing.accepted_prediction_tokens = accepted
        timing.rejected_prediction_tokens = rejected
        return stats

    def extension(self, stats: AnswerStats) -> dict[str, Any]:
        return {**draft_stats(stats), "remote": remote_stats(self.loop.stats)}

    async def complete(self, send: Send, headers: Headers) -> None:
        call = self.call
        try:
            text = "".join([t async for t in self.texts()])
        except RemoteFailure as exc:
            from gateway.errors import UpstreamError

            error = UpstreamError(f"the engine failed mid-answer: {exc}")
            from gateway.http.asgi import send_error

            call.timing.status = error.status
            call.timing.error = error.message
            await send_error(send, error, headers)
            return
        stats = self.stats()
        builder = ResponseBuilder(call.api, call.request.model)
        finish = self.output.finish_reason or "length"
        choice = ChoiceResult(text, finish, stop_reason=self.output.stop_string)
        body = builder.complete([choice], stats)
        body["draftgate"] = self.extension(stats)
        call.response_text = [text]
        await send_body(
            send,
            200,
            json.dumps(body, ensure_ascii=False).encode(),
            [(b"content-type", b"application/json"), *headers],
        )

    async def stream(self, send: Send, headers: Headers) -> None:
        call = self.call
        builder = ResponseBuilder(call.api, call.request.model)
        options = call.request.stream_options
        include_usage = bool(options and options.include_usage)
        await send(
            {"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]}
        )

        async def emit(body: bytes) -> None:
            await send({"type": "http.response.body", "body": body, "more_body": True})

        if call.openai_api == "chat":
            await emit(data_event(builder.chunk(role=True)))
        texts: list[str] = []
        try:
            async for text in self.texts():
                texts.append(text)
                await emit(data_event(builder.chunk(text)))
        except RemoteFailure as exc:
            log.warning("remote verify: the engine failed mid-answer: %s", exc)
            call.timing.status = 502
            call.timing.error = "the engine failed mid-answer"
            await emit(error_event("the engine failed mid-answer", "upstream_error"))
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        stats = self.stats()
        final = builder.chunk(
            finish=self.output.finish_reason or "length", stop_reason=self.output.stop_string
        )
        final["draftgate"] = self.extension(stats)
        await emit(data_event(final))
        if include_usage:
            await emit(data_event(builder.usage_chunk(stats)))
        await emit(DONE_EVENT)
        call.response_text = ["".join(texts)]
        await send({"type": "http.response.body", "body": b"", "more_body": False})
