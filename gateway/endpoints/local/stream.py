"""An engine thread's output as an OpenAI answer: ``Job`` carries each item across to the
event loop (``loop.call_soon_threadsafe`` into an ``asyncio.Queue``), then ``complete``
assembles one ``chat.completion``/``text_completion`` body or ``stream`` relays the items as
server-sent events. local_verifier is imported lazily, inside functions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.types import Send

from gateway.call import Call
from gateway.endpoints.local.tool_calls import CallParser, Parsed, ToolCall
from gateway.endpoints.openai_objects import ChoiceResult, Logprobs, ResponseBuilder, draft_stats
from gateway.endpoints.response_format import FIELD
from gateway.errors import GatewayError, InvalidRequest, UpstreamError
from gateway.http.asgi import Headers, send_body
from gateway.http.sse import DONE_EVENT, SSE_HEADERS, data_event, error_event

if TYPE_CHECKING:
    from local_verifier.engine import Event, GenerationStats, Handle, TextDelta

log = logging.getLogger(__name__)

Item = tuple[int, "Event"]  # (choice index, one of its events: local_verifier.events)


class Job:
    """One request's ``n`` generations: ``(index, item)`` pairs pushed from the engine
    thread (``push``, the engine's callback) and taken on the event loop (``next``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.n = n
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.handle: Handle | None = None
        self.ended: set[int] = set()  # choices whose engine delivered their last item

    @property
    def done(self) -> bool:
        return len(self.ended) == self.n

    def push(self, index: int, item: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (index, item))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            if self.handle is not None:
                self.handle.cancel()

    async def next(self, call: Call) -> Item:
        """The next ``(choice index, item)``; the wait counts as ``call``'s."""
        from local_verifier.events import Ended, Failed, GenerationStats

        t0 = time.perf_counter()
        index, item = await self.items.get()
        call.wait.seconds += time.perf_counter() - t0
        if isinstance(item, Ended | GenerationStats | Failed):
            self.ended.add(index)  # nothing but END follows
        return index, item


def combined(stats: list[GenerationStats]) -> GenerationStats:
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


def failed(exc: Exception, endpoint: str, tools: bool = False) -> GatewayError:
    """A generation failure. A grammar over the engine's per-token limits is the client's:
    a 400 naming ``response_format`` (``tools`` for a tool grammar) with the error's
    message. Any other failure's detail goes to the log, a generic message to the client."""
    from local_verifier.grammar import GrammarLimitExceeded

    if isinstance(exc, GrammarLimitExceeded):
        field = "tools" if tools else FIELD
        log.warning(
            "local endpoint %s: a %s grammar over the limits after %d tokens: %s",
            endpoint,
            field,
            exc.tokens,
            exc.reason,
        )
        message = (
            str(exc).replace(f"{FIELD}'s grammar", "the tools' grammar") if tools else str(exc)
        )
        return InvalidRequest(message, param=field, code="grammar_too_complex")
    log.error("local endpoint %s: generation failed", endpoint, exc_info=exc)
    return UpstreamError("local generation failed", code="generation_failed")


def _note_delta(call: Call, delta: TextDelta) -> None:
    now = time.perf_counter()
    timing = call.timing
    if timing.t_first_byte is None:
        timing.t_first_byte = now
    if delta.text and timing.t_first_content is None:
        timing.t_first_content = now
    timing.chunk_times.append(now)
    timing.chunk_tokens.append(len(delta.token_ids))


def _note_stats(call: Call, stats: GenerationStats) -> None:
    timing = call.timing
    timing.t_end = time.perf_counter()
    timing.output_tokens = stats.completion_tokens
    timing.prompt_tokens = stats.prompt_tokens
    timing.cached_tokens = stats.cached_tokens
    timing.accepted_prediction_tokens = stats.accepted_prediction_tokens
    timing.rejected_prediction_tokens = stats.rejected_prediction_tokens


async def complete(
    call: Call,
    job: Job,
    first: Item,
    logprobs: Logprobs | None,
    send: Send,
    headers: Headers,
    endpoint: str,
    tools: bool = False,
) -> None:
    """Sends ``job``'s ``n`` answers, from ``first`` on, as one JSON body (with each token's
    logprobs unless ``logprobs`` is None; with ``tools``, each split into text and calls)."""
    from local_verifier.events import Ended, Failed, GenerationStats

    n = job.n
    texts: list[list[str]] = [[] for _ in range(n)]
    tokens: list[list[Any]] = [[] for _ in range(n)]
    stats: dict[int, GenerationStats] = {}
    index, item = first
    while len(stats) < n:
        if isinstance(item, Failed):
            raise failed(item.error, endpoint, tools)
        if isinstance(item, Ended):
            if index not in stats:
                raise UpstreamError("local generation ended without statistics")
        elif isinstance(item, GenerationStats):
            stats[index] = item
        else:
            _note_delta(call, item)
            texts[index].append(item.text)
            tokens[index] += item.logprobs or []
        if len(stats) < n:
            index, item = await job.next(call)
    total = combined([stats[i] for i in range(n)])
    _note_stats(call, total)
    choices = [
        _choice(
            "".join(texts[i]),
            stats[i],
            None if logprobs is None else logprobs.format(tokens[i], i),
            tools,
        )
        for i in range(n)
    ]
    body = ResponseBuilder(call.api, call.request.model).complete(choices, total)
    call.response_text = ["".join(t) for t in texts]
    await send_body(
        send,
        200,
        json.dumps(body, ensure_ascii=False).encode(),
        [(b"content-type", b"application/json"), *headers],
    )


async def stream(
    call: Call,
    job: Job,
    first: Item,
    logprobs: Logprobs | None,
    send: Send,
    headers: Headers,
    endpoint: str,
    tools: bool = False,
) -> None:
    """Relays ``job``'s ``n`` answers, from ``first`` on, as server-sent events: chunks as
    the engine makes them (with their tokens' logprobs unless ``logprobs`` is None; with
    ``tools``, content and ``delta.tool_calls`` as OpenAI streams them), each answer's final
    chunk with its draft statistics, usage when asked, ``[DONE]``; a failure mid-stream as
    an error event."""
    from local_verifier.events import Ended, Failed, GenerationStats

    builder = ResponseBuilder(call.api, call.request.model)
    include_usage = bool(call.request.stream_options and call.request.stream_options.include_usage)
    await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, *headers]})

    async def emit(body: bytes) -> None:
        await send({"type": "http.response.body", "body": body, "more_body": True})

    n = job.n
    if call.openai_api == "chat":
        for i in range(n):
            await emit(data_event(builder.chunk(role=True, index=i)))
    texts: list[list[str]] = [[] for _ in range(n)]
    parsers = [CallParser() for _ in range(n)] if tools else None

    async def relay(parsed: Parsed, index: int, lp: dict[str, Any] | None) -> None:
        """A parsed piece as a content chunk (carrying ``lp``), then its tool-call deltas."""
        if parsed.content or (lp and not parsed.deltas):
            await emit(data_event(builder.chunk(parsed.content, index=index, logprobs=lp)))
            lp = None
        if parsed.deltas:
            chunk = builder.chunk(index=index, logprobs=lp, tool_calls=parsed.deltas)
            await emit(data_event(chunk))

    stats: dict[int, GenerationStats] = {}
    index, item = first
    while True:
        if isinstance(item, Failed):
            error = failed(item.error, endpoint, tools)
            call.timing.error = error.message
            if isinstance(error, UpstreamError):  # the engine's own failure
                call.timing.status = 500
                await emit(error_event(error.message, "server_error", error.code))
            else:  # the request's: the error body its 400 would have had
                call.timing.status = error.status
                await emit(data_event(error.payload()))
            break
        if isinstance(item, GenerationStats):
            stats[index] = item
            finish = item.finish_reason
            if parsers is not None:
                await relay(parsers[index].close(), index, None)
                finish = _finish(finish, parsers[index].calls)
            final = builder.chunk(finish=finish, index=index, stop_reason=item.stop_string)
            final["draftgate"] = draft_stats(item)
            await emit(data_event(final))
        elif not isinstance(item, Ended):
            if item.text or item.logprobs:
                lp = (
                    logprobs.format(item.logprobs, index)
                    if logprobs is not None and item.logprobs
                    else None
                )
                if parsers is None:
                    await emit(data_event(builder.chunk(item.text, index=index, logprobs=lp)))
                else:
                    await relay(parsers[index].feed(item.text), index, lp)
                texts[index].append(item.text)
            _note_delta(call, item)
        if len(stats) == n:
            total = combined([stats[i] for i in range(n)])
            _note_stats(call, total)
            if include_usage:
                await emit(data_event(builder.usage_chunk(total)))
            await emit(DONE_EVENT)
            call.response_text = ["".join(t) for t in texts]
            break
        if job.done:  # every choice ended, not all with statistics
            break
        index, item = await job.next(call)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _choice(
    text: str, stats: GenerationStats, logprobs: dict[str, Any] | None, tools: bool
) -> ChoiceResult:
    """One whole answer (``stats``: its own); with ``tools``, its text split into content
    and calls."""
    finish, stop = stats.finish_reason, stats.stop_string
    if not tools:
        return ChoiceResult(text, finish, logprobs, stop_reason=stop)
    parser = CallParser()
    parser.feed(text)
    parser.close()
    calls = tuple(c.openai() for c in parser.calls)
    finish = _finish(finish, parser.calls)
    return ChoiceResult(parser.text or "", finish, logprobs, calls, stop_reason=stop)


def _finish(finish: str, calls: list[ToolCall]) -> str:
    """``tool_calls`` for an answer that ended on its own after calls."""
    return "tool_calls" if calls and finish == "stop" else finish
