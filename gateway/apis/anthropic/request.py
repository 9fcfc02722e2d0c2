"""A Messages request as the internal chat request (OpenAI Chat Completions fields).

What each field becomes (docs/anthropic-api.md holds the same table for users):

- ``system`` (a string or text blocks, joined by blank lines) -> a first ``system``
  message; ``role: "system"`` turns stay ``system`` messages where they are;
- text blocks -> message text (a turn's blocks joined by blank lines); ``image`` ->
  an ``image_url`` part (base64 as a ``data:`` URL); a text ``document`` -> text;
- assistant ``tool_use`` -> ``tool_calls`` (``input`` as compact JSON ``arguments``);
  user ``tool_result`` -> a ``tool`` message per result, before the turn's other blocks;
- ``thinking``/``redacted_thinking`` blocks of earlier turns -> dropped (no endpoint
  behind a translation reads them);
- ``tools`` -> function tools (``input_schema`` as ``parameters``); ``tool_choice``
  ``auto``/``any``/``tool``/``none`` -> ``auto``/``required``/the named function/``none``,
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``;
- ``max_tokens``, ``top_p``, ``top_k``, ``stream`` as they are; ``stop_sequences`` ->
  ``stop``; ``temperature`` -> itself, when absent the door's default (the endpoint's
  ``messages_temperature``, else Anthropic's 1.0); a stream asks for usage
  (``stream_options.include_usage``);
- ``output_config.format`` (or ``output_format``) of type ``json_schema`` ->
  ``response_format`` (structured output through the grammar on local endpoints);
- ``draftgate`` (the gateway's extension) as it is;
- ``cache_control``, ``metadata``, ``thinking``, ``context_management``,
  ``output_config.effort``, ``service_tier`` and unknown fields -> nothing.

What cannot be carried and would change the answer is a 400 naming it: Anthropic's
server tools, PDF/URL/file documents, image files, images inside a tool result,
``mcp_servers``, more than four stop sequences. A body only endpoints speaking Messages
themselves receive needs no translation: :func:`relayed_only` gives its internal request.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import InvalidRequest
from sdk.wire import (
    DocumentBlock,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)

ANTHROPIC_TEMPERATURE = 1.0  # Anthropic's default when a request sends none
MAX_STOP_SEQUENCES = 4  # the internal request's (OpenAI's) limit
CLIENT_TOOL_TYPES = (None, "custom")
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# fields that would change the answer and that no translated endpoint can honour
_REFUSED_FIELDS = ("mcp_servers", "container")


def _refuse(path: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {what}", param=path, code="unsupported_parameter")


def _document_text(block: DocumentBlock, path: str) -> str:
    source = block.source
    kind = source.get("type")
    if kind == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if kind == "content":
        content = source.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list) and all(
            isinstance(b, dict) and b.get("type") == "text" for b in content
        ):
            return "\n\n".join(str(b.get("text", "")) for b in content)
    raise _refuse(path, f"documents of source type {kind!r} are not supported (plain text is)")


def _image_part(block: ImageBlock, path: str) -> dict[str, Any]:
    source = block.source
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise _refuse(
            path, f"images of source type {kind!r} are not supported (base64 and url are)"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _text(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A turn's parts: its text joined by blank lines, or the parts when one is an image."""
    if all(p["type"] == "text" for p in blocks):
        return "\n\n".join(p["text"] for p in blocks)
    return blocks


def _tool_result(block: ToolResultBlock, path: str) -> dict[str, Any]:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts = []
        for j, part in enumerate(content):
            if isinstance(part, TextBlock):
                texts.append(part.text)
            elif isinstance(part, DocumentBlock):
                texts.append(_document_text(part, f"{path}.content.{j}"))
            else:
                raise _refuse(f"{path}.content.{j}", "images in a tool result are not supported")
        text = "\n\n".join(texts)
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = json.dumps(block.input, ensure_ascii=False, separators=(",", ":"))
    return {
        "id": block.id,
        "type": "function",
        "function": {"name": block.name, "arguments": arguments},
    }


def _turn(message: InputMessage, path: str) -> list[dict[str, Any]]:
    """The chat messages for one Messages turn (a user turn with tool results gives one
    ``tool`` message per result, then its other blocks as a user message)."""
    role = message.role
    if isinstance(message.content, str):
        return [{"role": role, "content": message.content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        where = f"{path}.content.{j}"
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, DocumentBlock):
            parts.append({"type": "text", "text": _document_text(block, where)})
        elif isinstance(block, ImageBlock):
            if role == "assistant":
                raise _refuse(where, "an assistant turn cannot hold an image")
            parts.append(_image_part(block, where))
        elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
            continue
        elif isinstance(block, ToolUseBlock):
            if role != "assistant":
                raise _refuse(where, "tool_use blocks belong in assistant turns")
            calls.append(_tool_call(block))
        else:
            if role != "user":
                raise _refuse(where, "tool_result blocks belong in user turns")
            out.append(_tool_result(block, where))
    if calls:
        text = _text(parts) if parts else None
        out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
    elif parts or not out:
        out.append({"role": role, "content": _text(parts) if parts else ""})
    return out


def _system(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    return "\n\n".join(block.text for block in system) or None


def _tool(tool: ToolDefinition, path: str) -> dict[str, Any]:
    if tool.type not in CLIENT_TOOL_TYPES:
        raise _refuse(f"{path}.type", f"Anthropic's server tool {tool.type!r} is not supported")
    if tool.input_schema is None:
        raise InvalidRequest(f"{path}.input_schema: Field required", param=f"{path}.input_schema")
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    strict = (tool.model_extra or {}).get("strict")
    if isinstance(strict, bool):
        function["strict"] = strict
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest("tool_choice.name: Field required", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return _TOOL_CHOICES[choice.type]


def _response_format(extra: dict[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` (or the older ``output_format``) as ``response_format``."""
    config = extra.get("output_config")
    fmt = config.get("format") if isinstance(config, dict) else None
    name = "output_config.format"
    if fmt is None:
        fmt, name = extra.get("output_format"), "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _refuse(name, "only {'type': 'json_schema', 'schema': {...}} is supported")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{name}.schema: a JSON schema object is required", param=name)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _texts(value: Any) -> list[str]:
    """The strings of ``value``'s ``text`` members and of its string contents, in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        text = value.get("text")
        return [text] if isinstance(text, str) else _texts(value.get("content"))
    return []


def relayed_only(data: dict[str, Any]) -> dict[str, Any] | None:
    """The internal request of a body only an endpoint speaking Messages itself receives
    (it goes upstream as sent): its model, answer bound and text, for the limits to size.
    None when the body lacks even those (the translation's own 400 then stands)."""
    model, bound, messages = data.get("model"), data.get("max_tokens"), data.get("messages")
    if not isinstance(model, str) or not model or not isinstance(messages, list) or not messages:
        return None
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        return None
    texts = _texts(data.get("system")) + [t for m in messages for t in _texts(m)]
    return {
        "model": model,
        "messages": [{"role": "user", "content": "\n\n".join(t for t in texts if t)}],
        "max_tokens": bound,
        "stream": data.get("stream") is True,
    }


def to_chat(request: MessagesRequest, temperature: float = ANTHROPIC_TEMPERATURE) -> dict[str, Any]:
    """The internal chat request's fields for ``request`` (a 400 naming what cannot be
    carried); ``temperature`` is the default of a request without one."""
    extra = request.model_extra or {}
    for name in _REFUSED_FIELDS:
        if extra.get(name):
            raise _refuse(name, "not supported")
    messages: list[dict[str, Any]] = []
    system = _system(request.system)
    if system is not None:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        messages.extend(_turn(message, f"messages.{i}"))
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "temperature": temperature if request.temperature is None else request.temperature,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if request.top_p is not None:
        body["top_p"] = request.top_p
    if request.top_k is not None:
        body["top_k"] = request.top_k
    stops = [s for s in request.stop_sequences or () if s]
    if len(stops) > MAX_STOP_SEQUENCES:
        raise _refuse("stop_sequences", f"at most {MAX_STOP_SEQUENCES} are supported")
    if stops:
        body["stop"] = stops
    if request.tools:
        body["tools"] = [_tool(t, f"tools.{i}") for i, t in enumerate(request.tools)]
        if request.tool_choice is not None:
            body["tool_choice"] = _tool_choice(request.tool_choice)
            if request.tool_choice.disable_parallel_tool_use:
                body["parallel_tool_calls"] = False
    response_format = _response_format(extra)
    if response_format is not None:
        body["response_format"] = response_format
    if "draftgate" in extra:
        body["draftgate"] = extra["draftgate"]
    return body
