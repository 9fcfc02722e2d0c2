"""Tool calling's pieces without a model: the call parser (any split of the text gives the
same calls and the same streamed deltas reassemble to them), the checks on ``tools`` and
``tool_choice``, the plain rendering of a tool conversation (through Gemma 3's template,
which needs user and assistant turns to alternate) and a Hermes-style template that
renders the tools itself."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llguidance import LLMatcher

from gateway.endpoints.local import tools
from gateway.endpoints.local.stream import failed
from gateway.endpoints.local.tool_calls import CallParser, Parsed
from gateway.errors import InvalidRequest
from local_verifier.chat_template import render_chat
from local_verifier.families import gemma3
from local_verifier.gguf_file import GGUFFile
from local_verifier.gguf_tokenizer import tokenizer_from_metadata
from local_verifier.grammar import GrammarCompiler, GrammarLimitExceeded, JsonSchema
from local_verifier.loader import resolve_spec
from sdk.wire import ChatCompletionRequest

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ADD_A: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": False,
        },
    },
}
ADD: dict[str, Any] = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object"}},
}
# braces, brackets, quotes and the closing tag inside strings: only JSON ends the arguments
ARGUMENTS = '{"city": "Pa}ris \\"</tool_call>\\" {[", "n": [1, {"x": "]"}]}'
ANSWER = (
    "Let me look.\n"
    f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGUMENTS}}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add",\n "arguments": {}}\n</tool_call>\n'
)


def _parse(pieces: list[str]) -> tuple[CallParser, list[Parsed]]:
    parser = CallParser()
    parsed = [parser.feed(p) for p in pieces]
    parsed.append(parser.close())
    return parser, parsed


def _reassembled(parsed: list[Parsed]) -> tuple[str, list[dict[str, Any]]]:
    """Content and calls as an OpenAI client rebuilds them from the streamed deltas."""
    calls: list[dict[str, Any]] = []
    for piece in parsed:
        for delta in piece.deltas:
            if "id" in delta:
                assert delta["index"] == len(calls)
                assert delta["type"] == "function" and delta["function"]["arguments"] == ""
                calls.append({"id": delta["id"], "name": delta["function"]["name"], "args": ""})
            else:
                assert set(delta) == {"index", "function"} and set(delta["function"]) == {
                    "arguments"
                }
                calls[delta["index"]]["args"] += delta["function"]["arguments"]
    return "".join(p.content for p in parsed), calls


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(ANSWER)])
def test_any_split_gives_the_same_calls(size: int) -> None:
    parser, parsed = _parse([ANSWER[i : i + size] for i in range(0, len(ANSWER), size)])
    assert parser.text == "Let me look.\n"
    assert [(c.name, c.arguments) for c in parser.calls] == [
        ("get_weather", ARGUMENTS),
        ("add", "{}"),
    ]
    assert json.loads(parser.calls[0].arguments)["city"] == 'Pa}ris "</tool_call>" {['
    content, calls = _reassembled(parsed)
    assert content == parser.text
    assert [(c["id"], c["name"], c["args"]) for c in calls] == [
        (c.id, c.name, c.arguments) for c in parser.calls
    ]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parser.calls)


def test_text_that_only_looks_like_a_tag_is_content() -> None:
    parser, parsed = _parse(["a <tool", "_ b <", "/x> <tool_c"])
    assert parser.calls == [] and parser.text == "a <tool_ b </x> <tool_c"
    assert parsed[0].content == "a " and parsed[-1].content == "<tool_c"


def test_a_call_cut_short_keeps_what_arrived() -> None:
    parser, _ = _parse(['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b'])
    assert parser.text is None
    assert [(c.name, c.arguments) for c in parser.calls] == [("add", '{"a": 1, "b')]
    parser, _ = _parse(['<tool_call>\n{"name": "ad'])
    assert parser.calls == [] and parser.text == ""


def _request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools", "custom tool 'x'"),
        ({"tools": [{"type": "web_search"}]}, "tools", "'function'"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools", "name"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "given twice"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools",
            "parameters",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "must be"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "'x'",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]},
                ]
            },
            "messages",
            "tool_calls",
        ),
    ],
)
def test_bad_tool_fields_are_400s_naming_them(
    fields: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(InvalidRequest) as err:
        tools.plan(_request(**fields), None, None)
    assert err.value.param == param
    assert says in err.value.message


def test_tool_choice_shapes() -> None:
    given = tools.tools_of([WEATHER, ADD])
    named = {"type": "function", "function": {"name": "add"}}
    assert tools.choice_of(named, given) == tools.Choice("required", frozenset({"add"}), True)
    responses = {"type": "function", "name": "add"}
    assert tools.choice_of(responses, given) == tools.choice_of(named, given)
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [named]}}
    assert tools.choice_of(allowed, given) == tools.Choice("auto", frozenset({"add"}))
    assert tools.choice_of(None, given).mode == "auto"
    assert tools.choice_of(None, ()).mode == "none"


ROUND: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and 1+2?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "3"},
    {"role": "user", "content": "Thanks. And London?"},
]


def test_plain_rendering_alternates_turns_through_gemmas_template() -> None:
    request = _request(messages=ROUND, tools=[WEATHER, ADD])
    plan = tools.plan(request, gemma3.CHAT_TEMPLATE, None)
    assert plan is not None and not plan.template and plan.parse
    assert [m["role"] for m in plan.messages] == ["system", "user", "assistant", "user"]
    system = plan.messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools")
    assert json.dumps(tools.Tool("add", None, {"type": "object"}).spec()) in system
    assert plan.messages[2]["content"] == (
        "Checking.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'
    )
    assert plan.messages[3]["content"] == (
        "<tool_response>\n18C\n</tool_response>\n<tool_response>\n3\n</tool_response>\n"
        "Thanks. And London?"
    )
    prompt = render_chat(gemma3.CHAT_TEMPLATE, plan.messages, {"bos_token": "<bos>"})
    assert prompt.count("<start_of_turn>") == 4  # the system text joins the first user turn


def test_tool_choice_none_shows_no_tools_but_keeps_the_history() -> None:
    request = _request(messages=ROUND, tools=[WEATHER], tool_choice="none")
    plan = tools.plan(request, None, None)
    assert plan is not None and plan.grammar is None and not plan.parse
    assert "# Tools" not in plan.messages[0]["content"]
    assert "<tool_response>\n18C" in plan.messages[3]["content"]
    assert tools.plan(_request(tools=[WEATHER], tool_choice="none"), None, None)


# the Hermes convention (Qwen 2.5's template, shortened): tools in the system turn, calls
# in <tool_call> tags, results as tool turns
HERMES = """{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You help.' }}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Calls go in <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}{% continue %}{% endif %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def test_a_template_that_renders_tools_gets_them() -> None:
    assert tools.renders_tools(HERMES)
    assert not tools.renders_tools(gemma3.CHAT_TEMPLATE)
    request = _request(messages=ROUND, tools=[WEATHER])
    plan = tools.plan(request, HERMES, None)
    assert plan is not None and plan.template
    assert plan.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert plan.messages[3]["name"] == "get_weather"
    text = render_chat(
        HERMES, plan.messages, {}, tools=[t.spec() for t in plan.tools]
    )  # what ToolPlan.render encodes
    assert json.dumps(plan.tools[0].spec()) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "# Tools" not in text


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    """SmolLM2's tokenizer (from its GGUF metadata, no weights) for the grammar."""
    path, _ = resolve_spec("smollm2-135m")
    tokenizer = tokenizer_from_metadata(GGUFFile(path).fields.get, "llama")
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("mode", "parallel", "text", "taken"),
    [
        ("auto", False, "Hello there.", True),
        ("auto", False, "Let me add.\n" + CALL, True),
        ("auto", False, CALL + "\n", True),
        ("auto", False, "a <tool_ b </tool_call>", True),
        ("auto", False, CALL + "\nmore text", False),  # nothing after the calls
        ("auto", False, CALL.replace('"a"', '"b"'), False),  # not the tool's schema
        ("auto", False, CALL + "\n" + CALL, False),  # one call unless parallel
        ("auto", True, CALL + "\n" + WEATHER_CALL + "\n", True),
        ("required", False, "Hello", False),
        ("required", False, CALL, True),
        ("required", False, CALL.replace('"name": "add", ', ""), False),  # the name first
        ("function:add", False, WEATHER_CALL, False),
        ("function:add", True, CALL + "\n" + CALL, False),  # a named function: one call
    ],
)
def test_the_grammar_takes_exactly_the_answers_of_its_mode(
    compiler: GrammarCompiler, mode: str, parallel: bool, text: str, taken: bool
) -> None:
    given = tools.tools_of([WEATHER, ADD_A])
    named = mode.removeprefix("function:")
    if named != mode:
        choice = tools.Choice("required", frozenset({named}), single=True)
    else:
        choice = tools.Choice(mode, frozenset(t.name for t in given))
    matcher = compiler.compile(tools.call_grammar(given, choice, parallel, None)).constraint()
    ids = compiler.tokenizer.encode(text)
    consumed = all(matcher.matcher.consume_token(t) for t in ids)
    assert (consumed and matcher.matcher.is_accepting()) == taken


def test_references_to_the_parameters_definitions_hold(compiler: GrammarCompiler) -> None:
    """A schema as pydantic writes it: ``$defs`` and ``#/$defs/...`` references."""
    parameters = {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/Point"}},
        "required": ["at"],
    }
    tool = {"type": "function", "function": {"name": "go", "parameters": parameters}}
    choice = tools.Choice("required", frozenset({"go"}))
    grammar = compiler.compile(tools.call_grammar(tools.tools_of([tool]), choice, False, None))
    for at, taken in [('{"x": 1}', True), ('{"x": "a"}', False)]:
        text = f'<tool_call>\n{{"name": "go", "arguments": {{"at": {at}}}}}\n</tool_call>'
        matcher = grammar.constraint().matcher
        consumed = all(matcher.consume_token(t) for t in compiler.tokenizer.encode(text))
        assert (consumed and matcher.is_accepting()) == taken, text


def test_auto_with_a_response_format_is_its_json_or_calls(compiler: GrammarCompiler) -> None:
    given = tools.tools_of([ADD_A])
    choice = tools.Choice("auto", frozenset({"add"}))
    schema = JsonSchema({"type": "object", "properties": {"x": {"type": "integer"}}})
    grammar = compiler.compile(tools.call_grammar(given, choice, False, schema))
    for text, taken in [('{"x": 1}', True), ("Hello", False), (CALL, True)]:
        matcher = grammar.constraint().matcher
        consumed = all(matcher.consume_token(t) for t in compiler.tokenizer.encode(text))
        assert (consumed and matcher.is_accepting()) == taken, text


def test_the_grammar_is_valid_llguidance_for_every_mode() -> None:
    given = tools.tools_of([WEATHER, ADD])
    for mode in ("auto", "required"):
        for parallel in (False, True):
            choice = tools.Choice(mode, frozenset({"get_weather", "add"}))
            grammar = tools.call_grammar(given, choice, parallel, None)
            assert LLMatcher.validate_grammar(grammar) == ""


def test_a_tool_grammar_over_a_step_limit_is_the_clients_400_naming_tools() -> None:
    error = failed(GrammarLimitExceeded(3, "Parser Error: Too many items (limit 50000)"), "e", True)
    assert isinstance(error, InvalidRequest)
    assert error.param == "tools" and error.code == "grammar_too_complex"
    assert error.message.startswith("the tools' grammar exceeded the engine's per-token grammar")
    assert "after 3 output tokens" in error.message
