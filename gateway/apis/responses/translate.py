"""A Responses request as the internal chat-completions request.

``instructions`` and ``system``/``developer`` messages become system messages; user and
assistant messages keep their role (text parts joined, images as ``image_url`` parts);
``function_call`` and ``custom_tool_call`` items become an assistant message's
``tool_calls`` (consecutive calls in one message, after the text that precedes them),
their outputs ``tool`` messages; ``reasoning`` items are dropped (their content is
encrypted for the provider that made them). ``function`` and ``custom`` tools map to
their chat-completions forms (a ``namespace``'s under qualified names), other tool types
(hosted tools such as ``web_search``) are dropped; ``text.format`` becomes
``response_format``. A field
whose meaning cannot be kept is a 400 naming it (docs/responses-api.md lists each).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, PrivateAttr, TypeAdapter, ValidationError

from gateway.errors import InvalidRequest
from sdk.wire import ChatCompletionRequest
from sdk.wire.responses import (
    ContentPart,
    CustomTool,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    GrammarFormat,
    InputImage,
    InputItem,
    MessageItem,
    OutputText,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
)

# fields whose meaning the gateway cannot keep when set to anything but these
_REFUSED: dict[str, tuple[Any, ...]] = {
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "top_logprobs": (None, 0),
}
_FORMATS = ("text", "json_object", "json_schema")
ModelT = TypeVar("ModelT", bound=BaseModel)
_OUTPUT_KINDS = ("function_call", "custom_tool_call", "reasoning")
_CALLABLE = ("function", "custom")
_CHAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NAMESPACE_SEPARATOR = "__"
# a namespaced tool's chat name -> (its namespace, its own name)
Namespaced = dict[str, tuple[str, str]]
_ITEM: TypeAdapter[InputItem] = TypeAdapter(InputItem)


class TranslatedRequest(ChatCompletionRequest):
    """The internal request of a Responses call; ``responses`` keeps the client's request
    and the conversation's items (never sent upstream: a private attribute)."""

    _source: ResponsesRequest | None = PrivateAttr(default=None)
    _items: list[InputItem] = PrivateAttr(default_factory=list)
    _namespaced: Namespaced = PrivateAttr(default_factory=dict)

    @property
    def source(self) -> ResponsesRequest:
        assert self._source is not None
        return self._source

    @property
    def items(self) -> list[InputItem]:
        """Every input item the model sees: the continued responses' items, then the
        request's own."""
        return self._items

    @property
    def namespaced(self) -> Namespaced:
        """The chat names of namespaced tools -> (namespace, the tool's own name)."""
        return self._namespaced


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def check_refused(request: ResponsesRequest) -> None:
    """A 400 for a field set to something the gateway cannot honour."""
    extra = request.model_extra or {}
    for name, allowed in _REFUSED.items():
        value = extra.get(name)
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise InvalidRequest(
                f"{name}: not supported by this gateway", param=name, code="unsupported_parameter"
            )


def own_items(request: ResponsesRequest) -> list[InputItem]:
    """The request's ``input`` as items (a string is one user message)."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [MessageItem(role="user", content=request.input)]
    return list(request.input)


def stored_items(values: Sequence[dict[str, Any]]) -> list[InputItem]:
    """Items read back from the store (written by this gateway: valid by construction)."""
    return [_ITEM.validate_python(v) for v in values]


def _output_text(output: str | Sequence[BaseModel]) -> str:
    if isinstance(output, str):
        return output
    return "".join(getattr(p, "text", "") for p in output)


def _user_content(item: MessageItem, at: str) -> str | list[dict[str, Any]]:
    if isinstance(item.content, str):
        return item.content
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(item.content):
        if isinstance(part, InputImage):
            if part.image_url is None:
                raise _bad("input_image: only image_url images are supported", f"{at}.content.{k}")
            image = {"url": part.image_url, **({"detail": part.detail} if part.detail else {})}
            parts.append({"type": "image_url", "image_url": image})
        elif isinstance(part, Refusal):
            parts.append({"type": "text", "text": part.refusal})
        elif hasattr(part, "text"):
            parts.append({"type": "text", "text": part.text})
        else:
            raise _bad(f"{part.type}: not supported by this gateway", f"{at}.content.{k}")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def messages(
    instructions: str | None, items: Sequence[InputItem], own: int = 0
) -> list[dict[str, Any]]:
    """The chat messages for ``instructions`` and the conversation's ``items`` (the
    request's own from index ``own`` on: an error names ``input`` by their index)."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for i, item in enumerate(items):
        at = f"input.{i - own}"
        if isinstance(item, MessageItem):
            if item.role in ("system", "developer"):
                out.append({"role": "system", "content": item.text()})
            elif item.role == "assistant":
                out.append({"role": "assistant", "content": item.text()})
            else:
                out.append({"role": "user", "content": _user_content(item, at)})
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            if isinstance(item, FunctionCallItem):
                name = qualified(item.namespace, item.name)
                function = {"name": name, "arguments": item.arguments}
                call: dict[str, Any] = {
                    "id": item.call_id,
                    "type": "function",
                    "function": function,
                }
            else:
                custom = {"name": qualified(item.namespace, item.name), "input": item.input}
                call = {"id": item.call_id, "type": "custom", "custom": custom}
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            content = _output_text(item.output)
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": content})
        else:
            assert isinstance(item, ReasoningItem)  # dropped: not readable by another model
    return out


# the tags a union of items, parts or formats adds to an error's location: not fields
_TAGS = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "input_text",
        "output_text",
        "refusal",
        "input_image",
        "input_file",
        "text",
        "grammar",
    }
)
_BRANCHES = ("str", "int", "float", "bool", "none", "list[", "dict[")


def _location(loc: Sequence[int | str]) -> list[str]:
    """An error's location without the union branches and tags pydantic adds."""
    out: list[str] = []
    for k, part in enumerate(loc):
        before = loc[k - 1] if k else None
        if isinstance(part, str) and (
            part.startswith(_BRANCHES)
            or (part in _TAGS and (isinstance(before, int) or before == "format"))
        ):
            continue
        out.append(str(part))
    return out


def validated(model: type[ModelT], value: Any, at: str = "") -> ModelT:
    """``value`` as ``model``; a 400 naming the field of the deepest error (a bad item of
    ``input`` rather than ``input`` not being a string)."""
    try:
        return model.model_validate(value)
    except ValidationError as err:
        errors = err.errors()
        first = max(errors, key=lambda e: len(_location(e["loc"])))
        loc = ".".join([*([at] if at else []), *_location(first["loc"])]) or "body"
        raise InvalidRequest(f"{loc}: {first['msg']}", param=loc, code="invalid_field") from None


def qualified(namespace: str | None, name: str) -> str:
    """A tool's chat name: ``name``, after its namespace's name and ``__`` if it has one."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def _chat_tool(value: dict[str, Any], at: str, namespace: str | None) -> dict[str, Any]:
    """The chat form of one ``function`` or ``custom`` tool."""
    if value.get("type") == "function":
        tool = validated(FunctionTool, value, at)
        function: dict[str, Any] = {
            "name": qualified(namespace, tool.name),
            "parameters": tool.parameters or {"type": "object", "properties": {}},
        }
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        return {"type": "function", "function": function}
    custom = validated(CustomTool, value, at)
    spec: dict[str, Any] = {"name": qualified(namespace, custom.name)}
    if custom.description is not None:
        spec["description"] = custom.description
    if isinstance(custom.format, GrammarFormat):
        grammar = {"syntax": custom.format.syntax, "definition": custom.format.definition}
        spec["format"] = {"type": "grammar", "grammar": grammar}
    elif custom.format is not None:
        spec["format"] = {"type": "text"}
    return {"type": "custom", "custom": spec}


def tools(values: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], Namespaced]:
    """The chat tools for the request's ``function`` and ``custom`` tools, and those of
    its ``namespace`` tools under their qualified names (:func:`qualified`; one whose name
    is then not a valid or distinct chat name is dropped), with what each qualified name
    stands for. Other tool types are dropped."""
    out: list[dict[str, Any]] = []
    namespaced: Namespaced = {}
    for i, value in enumerate(values):
        kind = value.get("type")
        if kind in _CALLABLE:
            out.append(_chat_tool(value, f"tools.{i}", None))
        elif kind == "namespace" and isinstance(value.get("name"), str):
            inner = value.get("tools")
            for k, tool in enumerate(inner if isinstance(inner, list) else ()):
                if not isinstance(tool, dict) or tool.get("type") not in _CALLABLE:
                    continue
                chat = _chat_tool(tool, f"tools.{i}.tools.{k}", value["name"])
                name = chat[chat["type"]]["name"]
                if _CHAT_NAME.fullmatch(name) and name not in namespaced:
                    namespaced[name] = (value["name"], tool["name"])
                    out.append(chat)
    names = [t[t["type"]]["name"] for t in out]
    if len(names) != len(set(names)):
        raise _bad("tools: two tools share a name", "tools")
    return out, namespaced


def _tool_ref(value: Any, at: str) -> dict[str, Any]:
    """A chat reference to one function or custom tool (``{"type", "name"}``)."""
    if not isinstance(value, dict) or value.get("type") not in ("function", "custom"):
        kind = value.get("type") if isinstance(value, dict) else value
        raise _bad(f"{at}: tool type {kind!r} is not available here", at)
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(f"{at}.name must be a tool's name", at)
    return {"type": value["type"], value["type"]: {"name": name}}


def tool_choice(value: str | dict[str, Any], names: set[str]) -> str | dict[str, Any]:
    """The chat ``tool_choice``; a 400 when it forces a tool that is not among ``names``."""
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise _bad("tool_choice must be auto, none, required or a tool", "tool_choice")
        if value == "required" and not names:
            raise _bad("tool_choice required: no function or custom tool given", "tool_choice")
        return value
    if value.get("type") == "allowed_tools":
        mode = value.get("mode")
        refs = value.get("tools")
        if mode not in ("auto", "required") or not isinstance(refs, list):
            raise _bad("tool_choice: allowed_tools needs mode and tools", "tool_choice")
        chosen = [_tool_ref(r, f"tool_choice.tools.{k}") for k, r in enumerate(refs)]
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": chosen}}
    ref = _tool_ref(value, "tool_choice")
    if ref[ref["type"]]["name"] not in names:
        raise _bad(f"tool_choice names no given tool: {value.get('name')!r}", "tool_choice")
    return ref


def response_format(value: dict[str, Any]) -> dict[str, Any] | None:
    """The chat ``response_format`` for ``text.format`` (None: plain text)."""
    kind = value.get("type")
    if kind not in _FORMATS:
        raise _bad(f"text.format.type must be one of {', '.join(_FORMATS)}", "text.format")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    name = value.get("name")
    if not isinstance(name, str) or not isinstance(value.get("schema", {}), dict):
        raise _bad("text.format: json_schema needs a string name and a schema", "text.format")
    spec = {k: value[k] for k in ("name", "schema", "strict", "description") if k in value}
    return {"type": "json_schema", "json_schema": spec}


def translate(request: ResponsesRequest, history: Sequence[InputItem]) -> TranslatedRequest:
    """The internal request for ``request`` continuing the items ``history``."""
    check_refused(request)
    items = [*history, *own_items(request)]
    chat_messages = messages(request.instructions, items, len(history))
    if not chat_messages:
        raise _bad("input: no input items (and no instructions)", "input")
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    for name in ("temperature", "top_p", "user"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    chat_tools, namespaced = tools(request.tools or [])
    if chat_tools:
        body["tools"] = chat_tools
        if request.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.tool_choice is not None:
        names = {t[t["type"]]["name"] for t in chat_tools}
        choice = tool_choice(request.tool_choice, names)
        if chat_tools:
            body["tool_choice"] = choice
    if request.text is not None and request.text.format is not None:
        fmt = response_format(request.text.format)
        if fmt is not None:
            body["response_format"] = fmt
    if request.draftgate is not None:
        body["draftgate"] = request.draftgate.model_dump(exclude_unset=True)
    internal = validated(TranslatedRequest, body)
    internal._source = request
    internal._items = items
    internal._namespaced = namespaced
    return internal


def output_items(values: Sequence[dict[str, Any]]) -> list[InputItem]:
    """A stored response's output items as input items of the response continuing it
    (items of a provider's hosted tools, which no endpoint could read back, left out)."""
    items: list[InputItem] = []
    for value in values:
        kind = value.get("type")
        if kind == "message":
            parts: list[ContentPart] = [
                OutputText(text=str(p.get("text", ""))) for p in value.get("content", ())
            ]
            items.append(MessageItem(role="assistant", content=parts, id=value.get("id")))
        elif kind in _OUTPUT_KINDS:
            items.append(_ITEM.validate_python(value))
    return items
