"""OpenAI request fields onto a ``local_verifier`` generation request: which fields a local
engine honours, their checks (a 400 naming the field), the mapping itself and the documents
it drafts from. local_verifier is imported lazily, inside functions."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.call import Call
from gateway.endpoints.local.tools import ToolPlan, chat_messages
from gateway.endpoints.response_format import grammar_for
from gateway.errors import InvalidRequest
from lookup.agent_sources import conversation_documents
from lookup.corpus import Corpus, CorpusError
from lookup.draft import Source
from sdk.wire import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from local_verifier.engine import GenerationRequest
    from local_verifier.grammar import JsonSchema
    from local_verifier.logits_processors import Penalties
    from local_verifier.tokenizer import Tokenizer

log = logging.getLogger(__name__)

OpenAIRequest = ChatCompletionRequest | CompletionRequest

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
# Chat fields for tool calling (``tools.plan`` checks them)
_TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
# what a chat message may carry besides its role, content and name: its calls, the call
# a tool result answers
_MESSAGE_FIELDS = frozenset({"tool_calls", "tool_call_id"})
# Roles a chat template renders (OpenAI's, less the legacy ``function``)
_ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI fields the local engine still refuses (a 400 naming them), as /v1/models lists them
UNSUPPORTED_PARAMETERS = (
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
        "supported_parameters": sorted(_HONOURED | _TOOL_FIELDS),
        "unsupported_parameters": list(UNSUPPORTED_PARAMETERS),
    }


_OFF_VALUES: tuple[Any, ...] = (None, False, "", [], {})


def _is_off(name: str, value: Any) -> bool:
    """True when ``value`` asks for nothing (the field's default or an explicit off)."""
    if any(value is off or (type(value) is type(off) and value == off) for off in _OFF_VALUES):
        return True
    if name == "n":
        return bool(value == 1)
    if name == "tool_choice":  # a completions request has no tools: "none" and "auto" agree
        return value in ("none", "auto")
    return name == "parallel_tool_calls" and isinstance(value, bool)


def unsupported(request: OpenAIRequest) -> str | None:
    """The first request field the local engine cannot honour (set to something not off)."""
    given = request.model_fields_set
    fields = {name: getattr(request, name) for name in type(request).model_fields if name in given}
    fields.update(request.model_extra or {})
    chat = isinstance(request, ChatCompletionRequest)
    for name, value in fields.items():
        if chat and name in _TOOL_FIELDS:
            continue
        if name not in _HONOURED and not _is_off(name, value):
            return name
    if isinstance(request, ChatCompletionRequest):
        for message in request.messages:
            parts = message.content if isinstance(message.content, list) else []
            extra = {k for k, v in (message.model_extra or {}).items() if not _is_off(k, v)}
            if extra - _MESSAGE_FIELDS or any(part.get("type") != "text" for part in parts):
                return "messages"  # images, audio
    else:
        prompt = request.prompt
        if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str):
            return "prompt"
    return None


_UNSUPPORTED_REASONS = {
    "messages": "local models read text only (image, audio and file parts are not supported)"
}


def check_fields(request: OpenAIRequest) -> int:
    """The request's number of answers, after a 400 for a field the engine cannot honour
    or more than ``MAX_N`` answers."""
    field = unsupported(request)
    if field is not None:
        reason = _UNSUPPORTED_REASONS.get(field, "not supported by local endpoints")
        raise InvalidRequest(
            f"{field}: {reason}",
            param=field,
            code="unsupported_parameter",
        )
    _check_roles(request)
    n = request.n or 1
    if n > MAX_N:
        raise InvalidRequest(f"n must be at most {MAX_N} on local endpoints", param="n")
    _check_stop(request.stop_list())
    return n


def _check_roles(request: OpenAIRequest) -> None:
    """A 400 naming the first chat message whose role is not one of :data:`_ROLES`."""
    if not isinstance(request, ChatCompletionRequest):
        return
    for i, message in enumerate(request.messages):
        if message.role not in _ROLES:
            raise InvalidRequest(
                f"messages.{i}.role: {message.role!r} is not one of {', '.join(_ROLES)}",
                param=f"messages.{i}.role",
                code="invalid_value",
            )


def _check_stop(stop: list[str]) -> None:
    """A 400 naming ``stop`` for more stop strings, or longer ones, than the engine takes."""
    from local_verifier.stopping import MAX_STOP_CHARS, MAX_STOP_STRINGS

    if len(stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise InvalidRequest(
            f"stop: at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS}"
            " characters on local endpoints",
            param="stop",
        )


def invalid(exc: ValueError) -> InvalidRequest:
    """A 400 for a bad value, naming the sampling field its message starts with."""
    message = str(exc)
    return InvalidRequest(message, param=next((f for f in _PARAMS if message.startswith(f)), None))


def _penalties(request: OpenAIRequest) -> Penalties:
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


def top_logprobs(request: OpenAIRequest) -> int | None:
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


def requested_max_tokens(request: OpenAIRequest) -> int | None:
    """The answer length the request asks for (None: unset)."""
    if isinstance(request, ChatCompletionRequest):
        return request.max_completion_tokens or request.max_tokens
    return request.max_tokens


def generation_request(
    request: OpenAIRequest,
    *,
    max_tokens: int | None,
    tenant: str,
    owner: str,
    weight: float,
    tools: ToolPlan | None = None,
) -> GenerationRequest:
    """The engine's request for ``request``: its sampling, penalties, stop strings, grammar,
    logprobs, prompt or messages and prediction; answers of at most ``max_tokens``, the
    prefix cache shared within ``tenant``, fair scheduling charged to ``owner`` at ``weight``;
    with ``tools``, their conversation and grammar. A bad value is a 400 naming its field;
    documents are added by ``attach_documents``."""
    from local_verifier.engine import GenerationRequest
    from local_verifier.sampling import SamplingParams

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
        raise invalid(exc) from None
    grammar: str | JsonSchema | None = grammar_for(
        (request.model_extra or {}).get("response_format")
    )
    if tools is not None and tools.grammar is not None:  # it holds response_format's
        grammar = tools.grammar
    gen = GenerationRequest(
        params=params,
        max_tokens=max_tokens,
        stop=request.stop_list(),
        draft=request.draftgate is None or request.draftgate.draft,
        max_draft=request.draftgate.max_draft_tokens if request.draftgate else None,
        tenant=tenant,
        owner=owner,
        weight=weight,
        penalties=penalties,
        logprobs=top_logprobs(request),
        grammar=grammar,
    )
    if isinstance(request, ChatCompletionRequest):
        if tools is not None:
            gen.messages = tools.messages
        else:
            gen.messages = chat_messages(request.messages)
        gen.prediction = request.prediction.text() if request.prediction else None
    elif isinstance(request.prompt, str):
        gen.prompt = request.prompt
    elif request.prompt and isinstance(request.prompt[0], str):
        gen.prompt = str(request.prompt[0])
    else:
        gen.prompt_ids = [int(t) for t in request.prompt]
    return gen


async def attach_documents(
    gen: GenerationRequest,
    call: Call,
    corpus: Corpus,
    tokenizer: Tokenizer,
    *,
    recent: int,
    endpoint: str,
) -> None:
    """The files the conversation shows, in the forms an edit writes them, then named,
    recent and retrieved documents: tokens and sources into ``gen`` (tokenized on worker
    threads, not on the event loop; the corpus scans the prompt for mentions); an
    unavailable corpus is logged for ``endpoint`` and leaves ``gen`` without its documents."""
    if isinstance(call.request, ChatCompletionRequest):
        shown = [{"role": m.role, "content": m.text()} for m in call.request.messages]
        gen.documents = await asyncio.to_thread(
            conversation_documents, shown, tokenizer.encode, tokenizer.fingerprint
        )
        gen.document_sources = [Source.CONVERSATION] * len(gen.documents)
    try:
        docs = await corpus.select(
            call.tenant,
            ids=call.doc_ids,
            prompt_text=call.prompt_text(),
            prediction_text=gen.prediction or "",
            recent=recent,
        )
        if not docs:
            return
        gen.documents += await corpus.tokens(
            call.tenant, docs, tokenizer.fingerprint, tokenizer.encode
        )
        gen.document_sources += [_SOURCES[d.kind] for d in docs]
    except CorpusError as exc:
        log.warning("local endpoint %s: documents unavailable: %s", endpoint, exc)
