"""Prediction policy: what happens to a request's prediction at a given endpoint.

``decide`` reads the validated request and the endpoint's :class:`Capability` and
returns the outcome reported in ``X-Draftgate-Prediction``: ``passed``,
``dropped:<reason>``, ``synthesized`` (a prediction made from named cached documents),
``verified-locally`` (the local target drafts and verifies) or ``none``.
``upstream_body`` then rewrites the JSON body for the upstream only when needed.
"""

from __future__ import annotations

import itertools
import re
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import orjson

from gateway.errors import InvalidRequest
from gateway.http import json_slices
from gateway.http.validation import VECTOR_BYTES
from gateway.provider_table import Capability
from sdk.wire import ChatCompletionRequest, CompletionRequest

PASSED = "passed"
SYNTHESIZED = "synthesized"
VERIFIED_LOCALLY = "verified-locally"
NONE = "none"


def dropped(reason: str) -> str:
    return f"dropped:{reason}"


@dataclass(frozen=True)
class Decision:
    """``status`` for the header; ``synthesize``: fetch the named documents and send their
    text as the prediction; ``strip_prediction``: remove the client's prediction."""

    status: str
    synthesize: bool = False
    strip_prediction: bool = False


def header_document_ids(value: str | None) -> list[str]:
    """Ids from ``X-Draftgate-Documents``: comma-separated, each percent-decoded."""
    if not value:
        return []
    return [unquote(part.strip()) for part in value.split(",") if part.strip()]


def document_ids(
    request: ChatCompletionRequest | CompletionRequest, header: str | None, limit: int
) -> list[str]:
    """Document ids named by the ``draftgate`` extension object and the header, in order,
    without repeats; :class:`InvalidRequest` when more than ``limit`` are named (repeats
    count: refusing must not cost more than the ids are worth)."""
    named = [
        *(request.draftgate.documents if request.draftgate else ()),
        *header_document_ids(header),
    ]
    if len(named) > limit:
        raise _too_many_documents(len(named), limit)
    return list(dict.fromkeys(named))


# a key "documents" whose value is a list: outside strings, as a quote inside one is escaped
_DOCUMENTS_LIST = re.compile(rb'"documents"\s*:\s*\[')
_RAW_CANDIDATES = 4  # "documents" lists looked at before the body is parsed
# stands in for a counted list while the rest of the body is parsed; unknown to clients
_MARKER = f"draftgate-{secrets.token_hex(16)}"
_NAMED_PART = re.compile(r"[^,]*[^,\s][^,]*")  # a header part that is not blank


def check_header_document_count(value: bytes | None, limit: int) -> None:
    """:class:`InvalidRequest` when ``X-Draftgate-Documents`` alone names more than
    ``limit`` documents: counted before the request is admitted or its body read, reading
    at most ``limit + 1`` parts."""
    if not value or value.count(b",") < limit:
        return
    parts = _NAMED_PART.finditer(value.decode("latin-1"))
    named = sum(1 for _ in itertools.islice(parts, limit + 1))
    if named > limit:
        raise _too_many_documents(named, limit, at_least=True)


def check_raw_document_count(raw: bytes, limit: int) -> None:
    """:class:`InvalidRequest` when a body not yet parsed names more than ``limit``
    documents in ``draftgate.documents``: parsing 100k ids costs the event loop far more
    than counting them. The ids between a ``"documents": [`` and the next ``]`` are
    counted as the quotes there that no backslash precedes, two per id (a lower bound:
    a ``]`` inside an id ends the count early); the list is refused only when the body,
    parsed with it replaced by one marker id, has that marker as its
    ``draftgate.documents``. Anything else (an escaped key, a list elsewhere) is left to
    :func:`check_document_count` after the parse."""
    for match in itertools.islice(_DOCUMENTS_LIST.finditer(raw), _RAW_CANDIDATES):
        start = match.end()
        end = raw.find(b"]", start)
        if end < 0:
            return
        named = _quoted(raw, start, end) // 2
        if named > limit and _is_extension_list(raw, start, end):
            raise _too_many_documents(named, limit, at_least=True)


def _quoted(raw: bytes, start: int, end: int) -> int:
    """Quotes in ``raw[start:end]`` that no backslash precedes (vectorised when long)."""
    if end - start < VECTOR_BYTES:
        return raw.count(b'"', start, end) - raw.count(b'\\"', start, end)
    view = np.frombuffer(raw, np.uint8, end - start, start)
    quote = view == ord('"')
    escaped = np.count_nonzero(quote[1:] & (view[:-1] == ord("\\")))
    return int(np.count_nonzero(quote)) - int(escaped)


def _is_extension_list(raw: bytes, start: int, end: int) -> bool:
    """Whether ``raw[start:end]`` holds the items of the body's ``draftgate.documents``."""
    marked = b"".join((raw[:start], b'"', _MARKER.encode(), b'"', raw[end:]))
    try:
        data = orjson.loads(marked)
    except orjson.JSONDecodeError:
        return False
    extension = data.get("draftgate") if isinstance(data, dict) else None
    return isinstance(extension, dict) and extension.get("documents") == [_MARKER]


def check_document_count(data: dict[str, Any], limit: int) -> None:
    """:class:`InvalidRequest` when a body not yet validated names more than ``limit``
    documents in ``draftgate.documents`` (validating 100k ids costs more than counting
    them)."""
    extension = data.get("draftgate")
    named = extension.get("documents") if isinstance(extension, dict) else None
    if isinstance(named, list) and len(named) > limit:
        raise _too_many_documents(len(named), limit)


def _too_many_documents(count: int, limit: int, *, at_least: bool = False) -> InvalidRequest:
    return InvalidRequest(
        f"{'at least ' if at_least else ''}{count} documents named; at most {limit} per request",
        param="draftgate.documents",
        code="too_many_documents",
    )


def conflicting_feature(request: ChatCompletionRequest) -> str | None:
    """The first request feature that OpenAI-style providers reject with ``prediction``."""
    if request.tools:
        return "tools"
    if request.n is not None and request.n > 1:
        return "n"
    if request.logprobs or getattr(request, "top_logprobs", None):
        return "logprobs"
    if request.presence_penalty is not None and request.presence_penalty > 0:
        return "presence_penalty"
    if request.frequency_penalty is not None and request.frequency_penalty > 0:
        return "frequency_penalty"
    if request.max_completion_tokens is not None:
        return "max_completion_tokens"
    if request.audio is not None:
        return "audio"
    if request.modalities and any(m != "text" for m in request.modalities):
        return "modalities"
    return None


def _model_accepts(capability: Capability, upstream_model: str) -> bool:
    prefixes = capability.prediction_models
    return prefixes is None or upstream_model.startswith(prefixes)


def decide(
    request: ChatCompletionRequest | CompletionRequest,
    capability: Capability,
    *,
    upstream_model: str,
    doc_ids: list[str],
    accepts_override: bool | None = None,
    api_version: str | None = None,
    local: bool = False,
) -> Decision:
    """The draft outcome for ``request`` sent to an endpoint with ``capability``."""
    has_prediction = isinstance(request, ChatCompletionRequest) and request.prediction is not None
    wants_draft = request.draftgate is None or request.draftgate.draft
    if local:
        if wants_draft:
            return Decision(VERIFIED_LOCALLY)
        return Decision(dropped("draft-off") if has_prediction else NONE)
    if not has_prediction and not doc_ids:
        return Decision(NONE)
    if not wants_draft:
        return Decision(dropped("draft-off"), strip_prediction=has_prediction)
    if not isinstance(request, ChatCompletionRequest):
        return Decision(dropped("completions-api"))
    if accepts_override is not None:
        accepts = accepts_override
    else:
        accepts = capability.accepts_prediction and _model_accepts(capability, upstream_model)
    if not accepts:
        return Decision(dropped("unsupported"), strip_prediction=has_prediction)
    if (
        capability.min_api_version
        and accepts_override is None
        and (api_version or "") < capability.min_api_version
    ):
        return Decision(dropped("api-version"), strip_prediction=has_prediction)
    if capability.conflicts:
        feature = conflicting_feature(request)
        if feature is not None and feature in capability.conflicts:
            return Decision(dropped(feature), strip_prediction=has_prediction)
    if has_prediction:
        return Decision(PASSED)
    return Decision(SYNTHESIZED, synthesize=True)


# an answer's bound in the APIs relayed: chat (both), completions and Messages, Responses
ANSWER_BOUNDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


async def upstream_body(
    raw: bytes,
    data: dict[str, Any],
    *,
    upstream_model: str,
    strip_prediction: bool,
    prediction_text: str | None,
    cache_salt: str | None = None,
    max_tokens_cap: int | None = None,
) -> bytes:
    """The body to send upstream: ``raw`` untouched unless something must change (the
    ``draftgate`` object removed, the model renamed, the prediction dropped or set, the
    engine's ``cache_salt`` set, an answer bound past ``max_tokens_cap`` clamped to it:
    whichever of :data:`ANSWER_BOUNDS` the body's API uses), then re-encoded with orjson
    (compact, UTF-8 as sent: twice as fast as ``json.dumps``), long strings a slice at a
    time so that the event loop runs meanwhile (:func:`gateway.http.json_slices.dumps`)."""
    changed = (
        "draftgate" in data
        or data.get("model") != upstream_model
        or (strip_prediction and "prediction" in data)
        or prediction_text is not None
        or cache_salt is not None
    )
    over = [name for name in ANSWER_BOUNDS if _past(data.get(name), max_tokens_cap)]
    if not (changed or over):
        return raw
    body = dict(data)
    body.pop("draftgate", None)
    body["model"] = upstream_model
    if strip_prediction:
        body.pop("prediction", None)
    if prediction_text is not None:
        body["prediction"] = {"type": "content", "content": prediction_text}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    for name in over:
        body[name] = max_tokens_cap
    return await json_slices.dumps(body)


def _past(value: Any, cap: int | None) -> bool:
    """Whether ``value`` is an answer bound greater than ``cap``."""
    return cap is not None and type(value) is int and value > cap
