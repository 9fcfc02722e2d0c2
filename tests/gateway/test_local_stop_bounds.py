"""Stop strings on a local endpoint are bounded: more, or longer, than the engine takes is a
400 naming ``stop`` before anything runs (real SmolLM2 gateway, real ``openai`` client)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from local_verifier.stopping import MAX_STOP_CHARS

MESSAGES: list[Any] = [{"role": "user", "content": "Say hi."}]


@pytest.mark.parametrize("stop", [["x" * (MAX_STOP_CHARS + 1)], ["a", "y" * 5000]])
def test_an_overlong_stop_string_is_a_400_naming_stop(local_url: str, stop: list[str]) -> None:
    client = openai.OpenAI(base_url=f"{local_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="smollm2-135m", messages=MESSAGES, max_tokens=2, stop=stop
        )
    assert err.value.param == "stop"


def test_the_longest_stop_string_is_taken(local_url: str) -> None:
    client = openai.OpenAI(base_url=f"{local_url}/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=2, stop=["z" * MAX_STOP_CHARS]
    )
    assert answer.choices[0].finish_reason == "length"
