"""Chat message roles on a local endpoint: a role no chat template renders is a 400 naming
the message's role, as OpenAI answers it (real SmolLM2 gateway, real ``openai`` client)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.endpoints.local.endpoint import prompt_ids
from local_verifier.gguf_file import GGUFFile
from local_verifier.gguf_tokenizer import tokenizer_from_metadata
from local_verifier.loader import resolve_spec
from sdk.wire import ChatCompletionRequest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("role", ["bogus", "function", "model"])
def test_an_unknown_role_is_a_400_naming_it(local_url: str, role: str) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": role, "content": "Say hi."},
    ]
    with pytest.raises(openai.BadRequestError) as err:
        _client(local_url).chat.completions.create(
            model="smollm2-135m", messages=messages, max_tokens=2
        )
    assert err.value.param == "messages.1.role"
    assert err.value.code == "invalid_value"
    assert repr(role) in err.value.message


@pytest.mark.parametrize("role", ["system", "developer"])
def test_the_instruction_roles_are_answered(local_url: str, role: str) -> None:
    messages: list[Any] = [
        {"role": role, "content": "Be brief."},
        {"role": "user", "content": "Say hi."},
    ]
    answer = _client(local_url).chat.completions.create(
        model="smollm2-135m", messages=messages, max_tokens=2
    )
    assert answer.choices[0].finish_reason == "length"


@pytest.mark.parametrize("tools", [None, [WEATHER]])
def test_a_developer_message_renders_as_the_system_message(tools: Any) -> None:
    """OpenAI's ``developer`` role reaches the chat template as ``system`` (SmolLM2's
    template would otherwise write a ``developer`` turn the model never saw)."""
    path, _ = resolve_spec("smollm2-135m")
    tokenizer = tokenizer_from_metadata(GGUFFile(path).fields.get, "llama")

    def prompt(role: str) -> list[int]:
        body: dict[str, Any] = {
            "model": "smollm2-135m",
            "messages": [
                {"role": role, "content": "Answer in French."},
                {"role": "user", "content": "Name a colour."},
            ],
        }
        if tools:
            body["tools"] = tools
        return prompt_ids(ChatCompletionRequest.model_validate(body), tokenizer)

    developer = prompt("developer")
    assert developer == prompt("system")
    assert "developer" not in tokenizer.decode(developer)
