"""Tool calling on local endpoints: a chat request's ``tools``, ``tool_choice`` and tool
messages onto the engine's prompt and grammar (:func:`plan`).

Every model speaks one call format, Hermes' (Qwen 2.5's)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

calls separated by a newline, each result shown to the model as
``<tool_response>...</tool_response>``. A chat template that renders ``tools`` in that
format shows the tools and the history itself; every other model gets :data:`PREAMBLE` at
the end of its system message and the history rendered as plain text (:func:`plain_messages`).
Unless ``tool_choice`` is ``none``, the answer is constrained by a grammar over the tools'
JSON schemas (``required``: calls only; a named function: one call to it; ``auto``: text
that never opens a call, or text then calls), so a call is always JSON matching its schema.
docs/tool-calling.md says what each mode means. local_verifier is imported lazily.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.errors import InvalidRequest
from sdk.wire import ChatCompletionRequest, ChatMessage

if TYPE_CHECKING:
    from local_verifier.grammar import InvalidGrammar, JsonSchema
    from local_verifier.tokenizer import Tokenizer

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
SEPARATOR = "\n"  # between two calls, and inside a call's tags around its JSON
RESULT_OPEN = "<tool_response>"
RESULT_CLOSE = "</tool_response>"

PREAMBLE = f"""# Tools

You may call one or more of these functions, given as JSON within <tools></tools> tags:
<tools>
{{tools}}
</tools>

To call a function, answer with a JSON object of its name and arguments within \
{OPEN}{CLOSE} tags, one per call:
{OPEN}
{{{{"name": <function-name>, "arguments": <arguments-json-object>}}}}
{CLOSE}

A function's result comes back within {RESULT_OPEN}{RESULT_CLOSE} tags."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
# a function without ``parameters`` takes none
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_DEFINITIONS = ("$defs", "definitions")  # where a schema keeps the subschemas it refers to
# answer text in ``auto``: anything that never opens a call (llguidance's lexeme syntax)
_TEXT = f"/(.|\\n)+/ & ~/(.|\\n)*{OPEN}(.|\\n)*/"


@dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str | None
    parameters: Mapping[str, Any]

    def spec(self) -> dict[str, Any]:
        """The OpenAI tool object (as a chat template and the preamble show it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools reach the engine and come back."""

    tools: tuple[Tool, ...]  # the tools shown to the model (empty: none)
    messages: list[dict[str, Any]]  # the conversation as the engine renders it
    template: bool  # the model's chat template renders the tools (``render`` gives the prompt)
    grammar: str | None  # the answer's grammar (None: plain generation)

    @property
    def parse(self) -> bool:
        """Whether the answer is split into text and calls (it follows the tool grammar)."""
        return self.grammar is not None

    def render(self, tokenizer: Tokenizer) -> list[int]:
        """The prompt's token ids, the tools rendered by the model's own template."""
        from local_verifier.chat_template import render_chat

        assert tokenizer.chat_template is not None
        text = render_chat(
            tokenizer.chat_template,
            self.messages,
            tokenizer.special_tokens,
            tools=[t.spec() for t in self.tools] or None,
        )
        return tokenizer.encode(text, add_special_tokens=False)


def renders_tools(template: str | None) -> bool:
    """Whether a chat template renders ``tools`` and asks for calls in :data:`OPEN` tags."""
    from local_verifier.chat_template import uses_tools

    return bool(template) and uses_tools(template or "") and OPEN in (template or "")


def plan(
    request: ChatCompletionRequest, template: str | None, text: JsonSchema | None
) -> ToolPlan | None:
    """The request's tools, choice and history for a model with chat ``template`` (None:
    the request has none of them); ``text`` is ``response_format``'s grammar, which the text of an
    ``auto`` answer follows. A bad field is a 400 naming it; the schemas themselves are
    checked when the engine compiles the grammar (:func:`rejected`)."""
    history = any(m.role == "tool" or _extra(m, "tool_calls") for m in request.messages)
    given = tools_of(request.tools)
    if not given and not history:
        if request.tool_choice not in (None, "none", "auto"):
            raise _bad("tool_choice", "tool_choice needs tools")
        return None
    choice = choice_of(request.tool_choice, given)
    shown = () if choice.mode == "none" else given
    rendered = renders_tools(template)
    if rendered:
        messages = template_messages(request.messages)
    else:
        messages = plain_messages(request.messages, shown)
    grammar = None
    if shown:
        # one call per answer unless asked for more: small models given the choice repeat
        # a call until max_tokens (OpenAI's default, true, allows but never needs several)
        parallel = (request.model_extra or {}).get("parallel_tool_calls")
        if not isinstance(parallel, bool | None):
            raise _bad("parallel_tool_calls", "parallel_tool_calls must be a boolean")
        grammar = call_grammar(shown, choice, parallel is True, text)
    return ToolPlan(shown, messages, rendered, grammar)


def tools_of(value: Sequence[Any] | None) -> tuple[Tool, ...]:
    """``tools`` as :class:`Tool`s: function tools with distinct names; a 400 naming the
    first bad one."""
    tools: list[Tool] = []
    for i, tool in enumerate(value or ()):
        where = f"tools[{i}]"
        if isinstance(tool, dict) and tool.get("type") == "custom":
            raise _custom(tool)
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _bad("tools", f"{where}: only tools of type 'function' are supported")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _bad("tools", f"{where}.function must be an object")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise _bad("tools", f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}")
        if any(t.name == name for t in tools):
            raise _bad("tools", f"{where}.function.name: {name!r} is given twice")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise _bad("tools", f"{where}.function.description must be a string")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = _NO_PARAMETERS
        elif not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise _bad("tools", f"{where}.function.parameters must be a JSON schema of an object")
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def _custom(tool: Mapping[str, Any]) -> InvalidRequest:
    """The 400 for a ``custom`` tool (free-form input, or input in a grammar: Codex's
    ``apply_patch``), which local tool calling does not constrain. It names the tool by
    its name, which a front door's client knows (its index may differ there)."""
    spec = tool.get("custom")
    name = spec.get("name") if isinstance(spec, Mapping) else None
    return InvalidRequest(
        f"tools: the custom tool {name!r} is not supported by local endpoints, which "
        "call function tools only (a custom tool's free-form or grammar input is not "
        "constrained here); give it as a function tool",
        param="tools",
        code="unsupported_parameter",
    )


@dataclass(frozen=True)
class Choice:
    """``tool_choice``: ``mode`` (``none``, ``auto``: text or calls, ``required``: calls),
    the functions a call may name, whether an answer holds one call at most."""

    mode: str
    names: frozenset[str]
    single: bool = False


def choice_of(value: Any, tools: Sequence[Tool]) -> Choice:
    """``tool_choice`` as a :class:`Choice`: ``none``, ``auto``, ``required``, a named
    function (``{"type": "function", "function": {"name": ...}}``, or Responses'
    ``{"type": "function", "name": ...}``: one call to it) or ``{"type": "allowed_tools",
    "allowed_tools": {"mode": "auto" | "required", "tools": [named functions]}}``."""
    every = frozenset(t.name for t in tools)
    if value is None:
        return Choice("auto" if tools else "none", every)
    if value in ("none", "auto", "required"):
        if value != "none" and not tools:
            raise _bad("tool_choice", f"tool_choice {value!r} needs tools")
        return Choice(str(value), every)
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "function":
        return Choice("required", frozenset({_named(value, every, "tool_choice")}), single=True)
    allowed = value.get("allowed_tools") if kind == "allowed_tools" else None
    if isinstance(allowed, dict) and allowed.get("mode") in ("auto", "required"):
        refs = allowed.get("tools")
        if isinstance(refs, list) and refs:
            at = "tool_choice.allowed_tools.tools"
            names = frozenset(_named(r, every, f"{at}[{i}]") for i, r in enumerate(refs))
            return Choice(allowed["mode"], names)
    raise _bad(
        "tool_choice",
        "tool_choice must be 'none', 'auto', 'required', "
        '{"type": "function", "function": {"name": ...}} or '
        '{"type": "allowed_tools", "allowed_tools": {"mode": ..., "tools": [...]}}',
    )


def _named(ref: Any, names: frozenset[str], at: str) -> str:
    """The function a ``{"type": "function", ...}`` reference names, one of ``names``."""
    function = ref.get("function") if isinstance(ref, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name is None and isinstance(ref, dict) and ref.get("type") == "function":
        name = ref.get("name")
    if isinstance(name, str) and name in names:
        return name
    raise _bad("tool_choice", f"{at} names {name!r}, which is not one of the tools")


def call_grammar(
    tools: Sequence[Tool], choice: Choice, parallel: bool, text: JsonSchema | None
) -> str:
    """llguidance's grammar for an answer under ``choice`` (not ``none``): calls in
    :data:`OPEN` tags, each ``{"name": <const>, "arguments": <the tool's schema>}`` with
    the name first; ``auto`` also allows text (``text``'s JSON when given)."""
    from local_verifier.grammar import lark_grammar, lark_json

    callable_ = [t for t in tools if t.name in choice.names]
    bodies = " | ".join(lark_json(_call_schema(t)) for t in callable_)
    sep, tag = json.dumps(SEPARATOR), json.dumps(OPEN)
    # the calls after their first tag; a separator may also end them: a model that writes
    # one after every call (as after any closing tag) is not forced into another call
    rest = "body" if choice.single or not parallel else f"body ({sep} {tag} body)*"
    rules = [
        f"rest: {rest} {sep}?",
        f"body: {sep} ({bodies}) {json.dumps(SEPARATOR + CLOSE)}",
    ]
    if choice.mode != "auto":
        start = f"start: {tag} rest"
    elif text is not None:
        start = f"start: {lark_json(text.schema or {'type': 'object'})} | {tag} rest"
    else:  # text without a tag, or text up to the first tag (lazy: it ends there) and calls
        start = "start: TEXT? | opening rest"
        rules += [f"TEXT: {_TEXT}", f"opening[lazy]: /(.|\\n)*/ {tag}"]
    return lark_grammar("\n".join([start, *rules]))


def _call_schema(tool: Tool) -> dict[str, Any]:
    """The schema of a call's JSON; the parameters' definitions move to its root, where
    their ``#/$defs/...`` references point."""
    arguments = dict(tool.parameters)
    definitions = {k: arguments.pop(k) for k in _DEFINITIONS if k in arguments}
    return {
        **definitions,
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def rejected(tools: Sequence[Tool], error: InvalidGrammar) -> InvalidRequest:
    """The 400 for a tool grammar the engine refused: names the first tool whose schema
    llguidance refuses alone, else the tools together (their grammar over the limits)."""
    from local_verifier.grammar import schema_error

    for i, tool in enumerate(tools):
        reason = schema_error(tool.parameters)
        if reason is not None:
            return _bad("tools", f"tools[{i}].function.parameters: invalid JSON schema: {reason}")
    return _bad("tools", f"tools: the tools' grammar: {error}")


# -- the conversation ------------------------------------------------------------------


def template_role(role: str) -> str:
    """The role a chat template is given: OpenAI's ``developer`` message is the system
    message of the models that predate it, whose templates know only ``system``."""
    return "system" if role == "developer" else role


def chat_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as a chat template takes them without tools: each one's role and text."""
    return [{"role": template_role(m.role), "content": m.text()} for m in messages]


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as transformers passes them to a chat template that renders tools: an
    assistant's ``tool_calls`` with their arguments as objects, ``tool`` results with the
    name of the call they answer."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": template_role(message.role), "content": message.text()}
        calls = _calls(message, i)
        if calls:
            entry["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": _loaded(arguments)},
                }
                for call_id, name, arguments in calls
            ]
            names.update((call_id, name) for call_id, name, _ in calls if call_id)
        if message.role == "tool":
            call_id = _extra(message, "tool_call_id")
            entry["tool_call_id"] = call_id
            entry["name"] = message.name or names.get(str(call_id), "")
        out.append(entry)
    return out


def plain_messages(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Messages for a template that shows no tools: :data:`PREAMBLE` (when ``tools``) at the
    end of the system message (a new first one if there is none), an assistant's calls
    after its text in :data:`OPEN` tags as the model writes them, each run of ``tool``
    results as one user turn of :data:`RESULT_OPEN` blocks (a user message right after
    them joins that turn: templates that need user and assistant turns to alternate)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        text = message.text()
        if message.role == "tool":
            block = f"{RESULT_OPEN}\n{text}\n{RESULT_CLOSE}"
            out.append(_joined(out, block, tool=True))
            continue
        calls = _calls(message, i)
        if calls:
            written = SEPARATOR.join(_written(name, arguments) for _, name, arguments in calls)
            text = f"{text}\n{written}" if text else written
        if message.role == "user" and out and out[-1].get("tool"):
            out.append(_joined(out, text, tool=False))
            continue
        out.append({"role": template_role(message.role), "content": text})
    if tools:
        listed = "\n".join(json.dumps(t.spec(), ensure_ascii=False) for t in tools)
        preamble = PREAMBLE.format(tools=listed)
        if out and out[0]["role"] == "system":
            system = out[0]["content"]
            out[0] = {
                "role": "system",
                "content": f"{system}\n\n{preamble}" if system else preamble,
            }
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def _joined(out: list[dict[str, Any]], text: str, *, tool: bool) -> dict[str, Any]:
    """``text`` as a user turn, joined to the previous turn when that holds tool results."""
    if out and out[-1].get("tool"):
        previous = out.pop()
        return {"role": "user", "content": f"{previous['content']}\n{text}", "tool": tool}
    return {"role": "user", "content": text, "tool": tool}


def _written(name: str, arguments: str) -> str:
    """A call as the model writes it (the arguments as the client sent them, when JSON)."""
    body = arguments if isinstance(_loaded(arguments), dict) else "{}"
    return f'{OPEN}{SEPARATOR}{{"name": {json.dumps(name)}, "arguments": {body}}}{SEPARATOR}{CLOSE}'


def _calls(message: ChatMessage, index: int) -> list[tuple[str | None, str, str]]:
    """An assistant message's ``tool_calls`` as ``(id, name, arguments)``; a 400 naming
    ``messages`` when one is malformed."""
    calls = _extra(message, "tool_calls")
    if calls is None:
        return []
    where = f"messages[{index}].tool_calls"
    if message.role != "assistant" or not isinstance(calls, list):
        raise _bad("messages", f"{where}: a list, on assistant messages only")
    out: list[tuple[str | None, str, str]] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _bad("messages", f"{where}: each call needs a function with a name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise _bad("messages", f"{where}: a call's arguments must be a JSON string")
        call_id = call.get("id")
        out.append((call_id if isinstance(call_id, str) else None, function["name"], arguments))
    return out


def _loaded(arguments: str) -> Any:
    """A call's arguments as JSON (the string itself when it is not JSON)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _extra(message: ChatMessage, name: str) -> Any:
    return (message.model_extra or {}).get(name)


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)
