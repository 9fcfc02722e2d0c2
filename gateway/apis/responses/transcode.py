"""The internal chat-completions answer as a Responses answer (pure: no I/O).

:func:`from_completion` turns a ``chat.completion`` body into the response object;
:class:`StreamTranscoder` turns ``chat.completion.chunk`` events into the Responses
event stream. Output items: the answer's text as one ``message`` item, then one
``function_call`` or ``custom_tool_call`` item per tool call (``call_id`` is the chat
call's id). Item ids are made here once, so the stream's items and the final response's
agree. ``finish_reason`` ``length`` makes the response ``incomplete``
(``max_output_tokens``), ``content_filter`` likewise; anything else ``completed``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.apis.responses.translate import Namespaced
from sdk.wire.responses import (
    ArgumentsDeltaEvent,
    ContentPart,
    ContentPartEvent,
    CustomInputDoneEvent,
    CustomToolCallItem,
    ErrorEvent,
    FunctionArgumentsDoneEvent,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputItemEvent,
    OutputText,
    OutputTokensDetails,
    Response,
    ResponseError,
    ResponseEvent,
    ResponsesRequest,
    ResponseUsage,
    Status,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
)

# an OpenAI error type as the code of a failed response's error
_FAILED_CODES = {
    "invalid_request_error": "invalid_prompt",
    "rate_limit_error": "rate_limit_exceeded",
}
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# the internal request's field names as the Responses request calls them
PARAMS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def client_param(param: Any) -> Any:
    """An internal request's field name (``messages.3.content``) as the client's field."""
    if not isinstance(param, str):
        return param
    return PARAMS.get(param.split(".", 1)[0], param)


def base_response(request: ResponsesRequest, response_id: str) -> Response:
    """The response object for ``request`` before any output (status ``in_progress``)."""
    fields: dict[str, Any] = {
        name: getattr(request, name)
        for name in (
            "instructions",
            "temperature",
            "top_p",
            "max_output_tokens",
            "previous_response_id",
            "reasoning",
            "user",
            "prompt_cache_key",
            "safety_identifier",
        )
    }
    if request.tools is not None:
        fields["tools"] = request.tools
    if request.tool_choice is not None:
        fields["tool_choice"] = request.tool_choice
    if request.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    if request.text is not None and request.text.format is not None:
        fields["text"] = request.text
    return Response(
        id=response_id,
        created_at=time.time(),
        status="in_progress",
        model=request.model,
        metadata=request.metadata or {},
        store=request.store is not False,
        **fields,
    )


def usage(value: Any) -> ResponseUsage | None:
    """The Responses ``usage`` for a chat ``usage`` object (prediction counts kept)."""
    if not isinstance(value, dict):
        return None
    prompt = value.get("prompt_tokens") or 0
    completion = value.get("completion_tokens") or 0
    cached = (value.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    details = dict(value.get("completion_tokens_details") or {})
    details.setdefault("reasoning_tokens", 0)
    return ResponseUsage(
        input_tokens=prompt,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=completion,
        output_tokens_details=OutputTokensDetails(**details),
        total_tokens=value.get("total_tokens") or prompt + completion,
    )


def finished(response: Response, finish_reason: Any) -> None:
    """Set ``response``'s status from the chat answer's ``finish_reason``."""
    reason = _INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
    if reason is None:
        response.status = "completed"
    else:
        response.status = "incomplete"
        response.incomplete_details = IncompleteDetails(reason=reason)  # type: ignore[arg-type]


def call_item(
    kind: str, item_id: str, call_id: str, name: str, text: str, status: Status, names: Namespaced
) -> OutputItem:
    """A ``function_call`` (``text``: its arguments) or ``custom_tool_call`` (its input)
    item for a chat call to ``name`` (a namespaced tool's qualified name is split back
    into its namespace and name). Built unchecked: a model's call may lack a name."""
    namespace, own = names.get(name, (None, name))
    if kind == "custom_tool_call":
        return CustomToolCallItem.model_construct(
            id=item_id, call_id=call_id, name=own, input=text, status=status, namespace=namespace
        )
    return FunctionCallItem.model_construct(
        id=item_id, call_id=call_id, name=own, arguments=text, status=status, namespace=namespace
    )


def _call_item(call: dict[str, Any], names: Namespaced) -> OutputItem:
    call_id = call.get("id") or new_id("call")
    if call.get("type") == "custom" or "custom" in call:
        custom = call.get("custom") or {}
        name, text = custom.get("name") or "", custom.get("input") or ""
        return call_item("custom_tool_call", new_id("ctc"), call_id, name, text, "completed", names)
    function = call.get("function") or {}
    name, text = function.get("name") or "", function.get("arguments") or ""
    return call_item("function_call", new_id("fc"), call_id, name, text, "completed", names)


def from_completion(
    body: dict[str, Any], response: Response, names: Namespaced | None = None
) -> Response:
    """``response`` (from :func:`base_response`) with a ``chat.completion``'s answer
    (``names``: namespaced tools' qualified names, :attr:`TranslatedRequest.namespaced`)."""
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    text = message.get("content") or message.get("refusal") or ""
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    finished(response, choice.get("finish_reason"))
    output: list[OutputItem] = []
    if text or not calls:
        status: Status = "incomplete" if response.status == "incomplete" else "completed"
        output.append(
            MessageItem(
                id=new_id("msg"),
                role="assistant",
                status=status,
                content=[OutputText(text=text)],
            )
        )
    output.extend(_call_item(c, names or {}) for c in calls)
    response.output = output
    response.usage = usage(body.get("usage"))
    if isinstance(body.get("draftgate"), dict):
        response.draftgate = body["draftgate"]  # type: ignore[attr-defined]
    return response


def event(obj: StreamEvent) -> bytes:
    """One server-sent event: ``event:`` the type, ``data:`` the JSON."""
    kind: str = obj.type
    return b"event: " + kind.encode() + b"\ndata: " + obj.model_dump_json().encode() + b"\n\n"


@dataclass
class _Item:
    """An output item being streamed."""

    index: int
    kind: str  # message, function_call or custom_tool_call
    id: str
    call_id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    names: Namespaced = field(default_factory=dict)

    def text(self) -> str:
        return "".join(self.parts)

    def item(self, status: Status) -> OutputItem:
        text = self.text()
        if self.kind == "message":
            content: list[ContentPart] = (
                [OutputText(text=text)] if status != "in_progress" or text else []
            )
            return MessageItem(id=self.id, role="assistant", status=status, content=content)
        return call_item(self.kind, self.id, self.call_id, self.name, text, status, self.names)


class StreamTranscoder:
    """Chat chunks in, Responses events out, numbered from 0 (``sequence_number``)."""

    def __init__(self, response: Response, names: Namespaced | None = None) -> None:
        self.response = response
        self.names = names or {}
        self.sequence = 0
        self.items: list[_Item] = []
        self.message: _Item | None = None
        self.calls: dict[int, _Item] = {}  # by the chat tool call's index
        self.finish_reason: Any = None
        self.usage: Any = None
        self.draftgate: Any = None

    def _number(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def _lifecycle(self, kind: Any) -> bytes:
        return event(
            ResponseEvent(type=kind, sequence_number=self._number(), response=self.response)
        )

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        return self._lifecycle("response.created") + self._lifecycle("response.in_progress")

    def _open(
        self, kind: str, prefix: str, call_id: str = "", name: str = ""
    ) -> tuple[_Item, bytes]:
        item = _Item(len(self.items), kind, new_id(prefix), call_id, name, names=self.names)
        self.items.append(item)
        added = OutputItemEvent(
            type="response.output_item.added",
            sequence_number=self._number(),
            output_index=item.index,
            item=item.item("in_progress"),
        )
        return item, event(added)

    def _open_message(self) -> tuple[_Item, bytes]:
        item, out = self._open("message", "msg")
        self.message = item
        part = ContentPartEvent(
            type="response.content_part.added",
            sequence_number=self._number(),
            item_id=item.id,
            output_index=item.index,
            content_index=0,
            part=OutputText(text=""),
        )
        return item, out + event(part)

    def _text(self, text: str) -> bytes:
        out = b""
        item = self.message
        if item is None:
            item, out = self._open_message()
        item.parts.append(text)
        delta = TextDeltaEvent(
            sequence_number=self._number(),
            item_id=item.id,
            output_index=item.index,
            content_index=0,
            delta=text,
        )
        return out + event(delta)

    def _call(self, delta: dict[str, Any]) -> bytes:
        out = b""
        index = delta.get("index", 0)
        item = self.calls.get(index)
        if item is None:
            custom = delta.get("type") == "custom" or "custom" in delta
        else:  # the call's later pieces: of the kind its first piece set
            custom = item.kind == "custom_tool_call"
        spec = (delta.get("custom") if custom else delta.get("function")) or {}
        if item is None:
            kind, prefix = ("custom_tool_call", "ctc") if custom else ("function_call", "fc")
            call_id = delta.get("id") or new_id("call")
            item, out = self._open(kind, prefix, call_id, spec.get("name") or "")
            self.calls[index] = item
        elif spec.get("name") and not item.name:
            item.name = spec["name"]
        piece = spec.get("input" if custom else "arguments") or ""
        if piece:
            item.parts.append(piece)
            kind = (
                "response.custom_tool_call_input.delta"
                if custom
                else "response.function_call_arguments.delta"
            )
            out += event(
                ArgumentsDeltaEvent(
                    type=kind,  # type: ignore[arg-type]
                    sequence_number=self._number(),
                    item_id=item.id,
                    output_index=item.index,
                    delta=piece,
                )
            )
        return out

    def chunk(self, data: dict[str, Any]) -> bytes:
        """The events for one ``chat.completion.chunk``."""
        out = b""
        if data.get("usage"):
            self.usage = data["usage"]
        if isinstance(data.get("draftgate"), dict):
            self.draftgate = data["draftgate"]
        for choice in data.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("refusal")
            if text:
                out += self._text(text)
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def close(self) -> bytes:
        """Each open item's closing events; the response then holds its whole answer
        (its final event comes from :meth:`final`)."""
        response = self.response
        finished(response, self.finish_reason)
        status: Status = "incomplete" if response.status == "incomplete" else "completed"
        out = b""
        if not self.items:  # an empty answer is still one message
            out = self._open_message()[1]
        for item in self.items:
            n = item.index
            if item.kind == "message":
                part = OutputText(text=item.text())
                out += event(
                    TextDoneEvent(
                        sequence_number=self._number(),
                        item_id=item.id,
                        output_index=n,
                        content_index=0,
                        text=part.text,
                    )
                )
                out += event(
                    ContentPartEvent(
                        type="response.content_part.done",
                        sequence_number=self._number(),
                        item_id=item.id,
                        output_index=n,
                        content_index=0,
                        part=part,
                    )
                )
                done = item.item(status)
            elif item.kind == "custom_tool_call":
                out += event(
                    CustomInputDoneEvent(
                        sequence_number=self._number(),
                        item_id=item.id,
                        output_index=n,
                        input=item.text(),
                    )
                )
                done = item.item("completed")
            else:
                out += event(
                    FunctionArgumentsDoneEvent(
                        sequence_number=self._number(),
                        item_id=item.id,
                        output_index=n,
                        name=item.name,
                        arguments=item.text(),
                    )
                )
                done = item.item("completed")
            out += event(
                OutputItemEvent(
                    type="response.output_item.done",
                    sequence_number=self._number(),
                    output_index=n,
                    item=done,
                )
            )
        response.output = [
            item.item(status if item.kind == "message" else "completed") for item in self.items
        ]
        response.usage = usage(self.usage)
        if self.draftgate is not None:
            response.draftgate = self.draftgate  # type: ignore[attr-defined]
        return out

    def final(self) -> bytes:
        """``response.completed`` or ``response.incomplete`` (after :meth:`close`)."""
        kind = (
            "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        )
        return self._lifecycle(kind)

    def fail(
        self, message: str, code: str | None, param: str | None = None, kind: str | None = None
    ) -> bytes:
        """An ``error`` event (the internal error's ``code``), then ``response.failed``
        with what was answered so far and the error as a response error (its codes are
        few: the internal error's ``kind`` picks one)."""
        response = self.response
        response.status = "failed"
        response.error = ResponseError(
            code=_FAILED_CODES.get(kind or "", "server_error"), message=message
        )
        response.output = [item.item("incomplete") for item in self.items]
        error = ErrorEvent(
            sequence_number=self._number(), code=code, message=message, param=client_param(param)
        )
        return event(error) + self._lifecycle("response.failed")
