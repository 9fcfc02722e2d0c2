"""Tool calling on the local endpoint (real SmolLM2, real ``openai`` client): each
``tool_choice`` mode, calls that validate against their schemas, streamed deltas that
reassemble to the answer, a round with a tool result, bad schemas a 400 naming ``tools``,
and the same calls, token for token, with drafts on and off."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import openai
import pytest

from gateway.endpoints.local import tools
from gateway.endpoints.local.tool_calls import CallParser
from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.sampling import SamplingParams
from sdk.wire import ChatCompletionRequest

MODEL = "smollm2-135m"
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER_SCHEMA,
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers", "parameters": ADD_SCHEMA},
    },
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "add": ADD_SCHEMA}
WEATHER: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
COMMON: dict[str, Any] = {"model": MODEL, "tools": TOOLS, "temperature": 0, "max_tokens": 48}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _valid_calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    """The message's calls as (name, arguments), each checked against its tool's schema."""
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema_rs.validate(SCHEMAS[call.function.name], arguments)
        calls.append((call.function.name, arguments))
    return calls


def test_required_is_a_call_matching_its_schema(local_url: str) -> None:
    answer = client(local_url).chat.completions.create(
        **COMMON, messages=WEATHER, tool_choice="required"
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert _valid_calls(choice.message) == [("get_weather", {"city": "Paris", "unit": "celsius"})]


def test_a_named_function_is_the_one_called(local_url: str) -> None:
    named: Any = {"type": "function", "function": {"name": "add"}}
    answer = client(local_url).chat.completions.create(
        **COMMON, messages=WEATHER, tool_choice=named
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    [(name, _)] = _valid_calls(choice.message)
    assert name == "add"


def _engine_answer(
    engine: Engine, plan: tools.ToolPlan, *, draft: bool, prediction: str | None = None
) -> tuple[str, list[int], GenerationStats]:
    gen = GenerationRequest(
        messages=plan.messages,
        params=SamplingParams(temperature=0),
        max_tokens=COMMON["max_tokens"],
        grammar=plan.grammar,
        draft=draft,
        prediction=prediction,
    )
    items = list(engine.generate(gen))
    deltas = [i for i in items if isinstance(i, TextDelta)]
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids], stats


def _plan(engine: Engine, **fields: Any) -> tools.ToolPlan:
    request = ChatCompletionRequest.model_validate({**COMMON, **fields})
    plan = tools.plan(request, engine.tokenizer.chat_template, None)
    assert plan is not None
    return plan


def test_auto_answers_text_or_calls_as_the_engine_does(local_url: str, engine: Engine) -> None:
    """``auto``: the grammar lets the model choose; SmolLM2 answers this one in text, the
    engine's own answer under the same prompt and grammar."""
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    answer = client(local_url).chat.completions.create(
        **COMMON, messages=messages, tool_choice="auto"
    )
    choice = answer.choices[0]
    text, _, _ = _engine_answer(engine, _plan(engine, messages=messages), draft=False)
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == text
    assert text and tools.OPEN not in text


def test_none_shows_no_tools(local_url: str) -> None:
    """``none``: the answer is the one without tools, word for word."""
    kw: dict[str, Any] = {"model": MODEL, "messages": WEATHER, "temperature": 0, "max_tokens": 16}
    with_tools = client(local_url).chat.completions.create(**kw, tools=TOOLS, tool_choice="none")
    without = client(local_url).chat.completions.create(**kw)
    assert with_tools.choices[0].message.tool_calls is None
    assert with_tools.choices[0].message.content == without.choices[0].message.content


def test_streamed_deltas_reassemble_to_the_answer(local_url: str) -> None:
    """Two calls (``parallel_tool_calls``): the first delta of each carries its index, id,
    type and name with empty arguments, later ones only argument fragments; together they
    are the non-streamed calls, and the stream ends with ``tool_calls``."""
    kw: dict[str, Any] = {
        **COMMON,
        "messages": WEATHER,
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_tokens": 64,
    }
    answer = client(local_url).chat.completions.create(**kw)
    want = [(c.function.name, c.function.arguments) for c in answer.choices[0].message.tool_calls]
    assert len(want) >= 2  # SmolLM2 repeats its call when it may
    calls: list[dict[str, str]] = []
    finish = None
    for chunk in client(local_url).chat.completions.create(**kw, stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or ():
            if delta.id is not None:
                assert delta.index == len(calls) and delta.type == "function"
                assert delta.function.name and delta.function.arguments == ""
                calls.append({"name": delta.function.name, "arguments": ""})
            else:
                assert delta.function.name is None and delta.type is None
                calls[delta.index]["arguments"] += delta.function.arguments
    assert [(c["name"], c["arguments"]) for c in calls] == want
    assert finish == answer.choices[0].finish_reason


def test_a_round_with_a_tool_result(local_url: str) -> None:
    """The model's call and the tool's result go back in; the model answers from them."""
    first = client(local_url).chat.completions.create(
        **COMMON, messages=WEATHER, tool_choice="required"
    )
    call = first.choices[0].message.tool_calls[0]
    messages: list[Any] = [
        *WEATHER,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    answer = client(local_url).chat.completions.create(**COMMON, messages=messages)
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls", "length")
    if choice.message.tool_calls is None:
        assert choice.message.content and tools.OPEN not in choice.message.content
    else:
        _valid_calls(choice.message)


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "strin"}}},
            "tools[1].function.parameters",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "tools[1]"),
    ],
)
def test_a_schema_the_grammar_engine_refuses_is_400_naming_tools(
    local_url: str, parameters: dict[str, Any], says: str
) -> None:
    bad: Any = [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": parameters}}]
    with pytest.raises(openai.BadRequestError) as err:
        client(local_url).chat.completions.create(
            **{**COMMON, "tools": bad}, messages=WEATHER, tool_choice="required"
        )
    assert err.value.param == "tools"
    assert says in err.value.message


def test_drafted_calls_are_plain_decodings_token_for_token(local_url: str, engine: Engine) -> None:
    """Greedy, engine level: drafts from a prediction of the call give the same token ids
    as plain decoding, with the drafts accepted; through HTTP, the same calls."""
    plan = _plan(engine, messages=WEATHER, tool_choice="required")
    text, ids, _ = _engine_answer(engine, plan, draft=False)
    drafted, drafted_ids, stats = _engine_answer(engine, plan, draft=True, prediction=text)
    assert stats.accepted_tokens > 0
    assert drafted_ids == ids and drafted == text
    kw: dict[str, Any] = {**COMMON, "messages": WEATHER, "tool_choice": "required"}
    plain = client(local_url).chat.completions.create(
        **kw, extra_body={"draftgate": {"draft": False}}
    )
    fast = client(local_url).chat.completions.create(
        **kw, prediction={"type": "content", "content": text}
    )
    assert (fast.model_extra or {})["draftgate"]["accepted_tokens"] > 0
    assert [c.function for c in fast.choices[0].message.tool_calls] == [
        c.function for c in plain.choices[0].message.tool_calls
    ]


def test_a_template_that_renders_tools_prompts_the_engine(engine: Engine) -> None:
    """SmolLM2's tokenizer with a Hermes-style template: the template renders the tools
    (no preamble), and the prompt it gives yields a call of the grammar."""
    from local_verifier.tokenizer import Tokenizer
    from tests.gateway.test_local_tools_parse import HERMES

    own = engine.tokenizer
    hermes = Tokenizer(
        own.backend,
        eos_ids=own.eos_ids,
        bos_id=own.bos_id,
        chat_template=HERMES,
        special_tokens=own.special_tokens,
        add_bos=own.add_bos,
    )
    request = ChatCompletionRequest.model_validate(
        {**COMMON, "messages": WEATHER, "tool_choice": "required"}
    )
    plan = tools.plan(request, HERMES, None)
    assert plan is not None and plan.template
    ids = plan.render(hermes)
    prompt = hermes.decode(ids)
    assert json.dumps(TOOLS[0]) in prompt and "# Tools" not in prompt
    gen = GenerationRequest(
        prompt_ids=ids, params=SamplingParams(temperature=0), max_tokens=48, grammar=plan.grammar
    )
    text = "".join(i.text for i in engine.generate(gen) if isinstance(i, TextDelta))
    parser = CallParser()
    parser.feed(text)
    parser.close()
    assert [c.name for c in parser.calls] in (["get_weather"], ["add"])
    jsonschema_rs.validate(SCHEMAS[parser.calls[0].name], json.loads(parser.calls[0].arguments))
