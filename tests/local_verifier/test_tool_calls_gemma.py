"""Tool calls on the real Gemma 3 270M: its template renders no tools and needs user and
model turns to alternate, so the tools go in the generic preamble (folded into the first
user turn) and a tool result joins the user's turn. A required call is JSON of its schema,
token for token the same with drafts on and off; a round with the result renders and runs."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest

from gateway.endpoints.local import tools
from gateway.endpoints.local.tool_calls import CallParser
from local_verifier.engine import Engine, GenerationRequest, GenerationStats, TextDelta
from local_verifier.loader import GEMMA3_ALIAS, load_model
from local_verifier.sampling import SamplingParams
from sdk.wire import ChatCompletionRequest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string", "maxLength": 24}},
    "required": ["path"],
    "additionalProperties": False,
}
READ: dict[str, Any] = {
    "type": "function",
    "function": {"name": "read_file", "description": "Read a file", "parameters": SCHEMA},
}
ASK: list[dict[str, Any]] = [{"role": "user", "content": "Show me what is in setup.py."}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    lm = load_model(GEMMA3_ALIAS, device="cpu", dtype="float32", max_seq_len=1024)
    costs = [0.02 + 0.001 * rows for rows in range(80 + 1)]  # no calibration run
    return Engine(lm, max_draft=16, token_budget=64, row_costs=costs)


def _answer(
    engine: Engine, messages: list[Any], *, draft: bool, prediction: str | None = None
) -> tuple[str, list[int], GenerationStats]:
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": messages, "tools": [READ], "tool_choice": "required"}
    )
    plan = tools.plan(request, engine.tokenizer.chat_template, None)
    assert plan is not None and not plan.template
    gen = GenerationRequest(
        messages=plan.messages,
        params=SamplingParams(temperature=0),
        max_tokens=64,
        grammar=plan.grammar,
        draft=draft,
        prediction=prediction,
    )
    items = list(engine.generate(gen))
    deltas = [i for i in items if isinstance(i, TextDelta)]
    stats = items[-1]
    assert isinstance(stats, GenerationStats)
    return "".join(d.text for d in deltas), [t for d in deltas for t in d.token_ids], stats


def test_a_required_call_is_identical_with_drafts(engine: Engine) -> None:
    text, ids, stats = _answer(engine, ASK, draft=False)
    assert stats.finish_reason == "stop"
    parser = CallParser()
    parser.feed(text)
    parser.close()
    [call] = parser.calls
    assert call.name == "read_file"
    jsonschema_rs.validate(SCHEMA, json.loads(call.arguments))
    drafted, drafted_ids, drafted_stats = _answer(engine, ASK, draft=True, prediction=text)
    assert drafted_stats.accepted_tokens > 0
    assert drafted_ids == ids and drafted == text


def test_a_round_with_the_result_renders_and_runs(engine: Engine) -> None:
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "setup.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "from setuptools import setup"},
        {"role": "user", "content": "Now read README.md."},
    ]
    text, _, stats = _answer(engine, messages, draft=False)
    assert stats.finish_reason == "stop"
    assert text.startswith(f'{tools.OPEN}\n{{"name": "read_file"')
