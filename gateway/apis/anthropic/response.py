"""A chat-completions answer as a Messages answer: the stop reason, the usage, and the
whole ``message`` object of a non-streamed answer.

``finish_reason`` ``stop`` is ``end_turn``, or ``stop_sequence`` where the endpoint says
which stop string matched (vLLM's ``stop_reason`` on the choice); ``length`` is
``max_tokens`` (also when the endpoint's own cap ended the answer); ``tool_calls`` (or
any answer carrying calls) is ``tool_use``; ``content_filter`` is ``refusal``. Usage:
``input_tokens`` is the prompt less its cached tokens, ``cache_read_input_tokens`` the
cached ones, ``cache_creation_input_tokens`` 0 (nothing is billed for writing a cache).
"""

from __future__ import annotations

import json
from typing import Any

from sdk.wire import MessagesResponse, MessagesUsage, StopReason, TextBlock, ToolUseBlock

_STOP_REASONS: dict[str, StopReason] = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class BadToolCall(Exception):
    """A tool call whose ``arguments`` are not a JSON object (Messages needs an object)."""


def message_id(chat_id: Any) -> str:
    """The message id for a chat completion's id (``chatcmpl-x`` -> ``msg_x``)."""
    text = str(chat_id or "")
    return "msg_" + (text.split("-", 1)[1] if "-" in text else text)


def stop_reason(
    finish: Any, choice: dict[str, Any], stops: list[str], calls: bool
) -> tuple[StopReason, str | None]:
    """``stop_reason`` and ``stop_sequence`` for a choice's ``finish_reason`` (``calls``:
    whether the answer holds tool calls; a call cut by the length limit is ``max_tokens``)."""
    if finish in _STOP_REASONS:
        return _STOP_REASONS[finish], None
    if calls:
        return "tool_use", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def usage(openai: Any) -> MessagesUsage:
    """Messages usage from an OpenAI ``usage`` object (zeros where it is missing)."""
    if not isinstance(openai, dict):
        return MessagesUsage()
    prompt = openai.get("prompt_tokens")
    completion = openai.get("completion_tokens")
    details = openai.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = prompt if isinstance(prompt, int) else 0
    cached = cached if isinstance(cached, int) else 0
    return MessagesUsage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=completion if isinstance(completion, int) else 0,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=cached,
    )


def tool_input(arguments: Any, cut: bool = False) -> dict[str, Any]:
    """A call's ``arguments`` (JSON text) as the ``input`` object; :class:`BadToolCall`
    when they are not a JSON object, unless the length limit ``cut`` them (then ``{}``, as
    a stream's partial input would not parse either)."""
    if arguments in (None, ""):
        return {}
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        if cut:
            return {}
        raise BadToolCall("the model's tool call arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise BadToolCall("the model's tool call arguments are not a JSON object")
    return value


def message(chat: dict[str, Any], model: str, stops: list[str]) -> dict[str, Any]:
    """The Messages answer for a ``chat.completion`` (its first choice); ``model`` is the
    name the client asked for. The gateway's ``draftgate`` statistics are kept."""
    choices = chat.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    answer = choice.get("message") or {}
    content: list[TextBlock | ToolUseBlock] = []
    text = answer.get("content")
    if isinstance(text, str) and text:
        content.append(TextBlock(text=text))
    calls = [c for c in answer.get("tool_calls") or () if isinstance(c, dict)]
    cut = choice.get("finish_reason") == "length"
    for call in calls:
        function = call.get("function") or {}
        content.append(
            ToolUseBlock(
                id=str(call.get("id") or ""),
                name=str(function.get("name") or ""),
                input=tool_input(function.get("arguments"), cut),
            )
        )
    reason, sequence = stop_reason(choice.get("finish_reason"), choice, stops, bool(calls))
    body = MessagesResponse(
        id=message_id(chat.get("id")),
        model=model,
        content=content,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=usage(chat.get("usage")),
    ).model_dump(mode="json")
    if "draftgate" in chat:
        body["draftgate"] = chat["draftgate"]
    return body
