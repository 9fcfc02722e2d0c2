"""The real ``openai`` client through the gateway to the stand-in upstream."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.gateway.conftest import UPSTREAM_KEY
from tests.openai_standin import ANSWER, StandIn, tokens

MESSAGES = [{"role": "user", "content": "Say hello."}]
PREDICTED = "def add(a, b):\n    return a + b"


def client(url: str, key: str = "alice-key") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def aclient(url: str, key: str = "alice-key") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_sync_chat_completion(gateway_url: str, standin: StandIn) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=MESSAGES
    )
    answer = raw.parse()
    assert answer.choices[0].message.content == ANSWER
    assert raw.headers["x-draftgate-prediction"] == "none"
    assert float(raw.headers["x-draftgate-overhead-ms"]) >= 0
    seen = standin.requests[-1]
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "gpt-4o-mini"


async def test_async_chat_stream(gateway_url: str, standin: StandIn) -> None:
    async with aclient(gateway_url) as c:
        stream = await c.chat.completions.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage
    assert text == ANSWER
    assert usage is not None and usage.completion_tokens == len(tokens(ANSWER))


def test_sync_stream_headers(gateway_url: str, standin: StandIn) -> None:
    with client(gateway_url).chat.completions.with_streaming_response.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True
    ) as response:
        assert response.headers["x-accel-buffering"] == "no"
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "x-draftgate-overhead-ms" in response.headers
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text == ANSWER


async def test_async_completions_non_stream(gateway_url: str, standin: StandIn) -> None:
    async with aclient(gateway_url) as c:
        answer = await c.completions.create(model="gpt-4o-mini", prompt="Say hello.")
    assert answer.choices[0].text == ANSWER
    assert standin.requests[-1].path == "/v1/completions"


def test_completions_stream(gateway_url: str, standin: StandIn) -> None:
    stream = client(gateway_url).completions.create(model="mini", prompt="Hi", stream=True)
    assert "".join(c.choices[0].text for c in stream) == ANSWER
    assert standin.requests[-1].body["model"] == "gpt-4o-mini"  # alias -> provider name


def test_prediction_passed_with_usage(gateway_url: str, standin: StandIn) -> None:
    code = f"```python\n{PREDICTED}\n```"  # the stand-in answers with the prompt's code
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"Repeat this code:\n{code}"}],
        prediction={"type": "content", "content": code},
    )
    answer = raw.parse()
    assert raw.headers["x-draftgate-prediction"] == "passed"
    assert standin.requests[-1].body["prediction"]["content"] == code
    assert answer.choices[0].message.content == code
    details = answer.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == len(tokens(code))
    assert details.rejected_prediction_tokens == 0


def test_prediction_dropped_for_engine_that_ignores_it(gateway_url: str, standin: StandIn) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="llama", messages=MESSAGES, prediction={"type": "content", "content": PREDICTED}
    )
    assert raw.headers["x-draftgate-prediction"] == "dropped:unsupported"
    assert "prediction" not in standin.requests[-1].body
    assert raw.parse().choices[0].message.content == ANSWER


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.1}, "frequency_penalty"),
        ({"max_completion_tokens": 50}, "max_completion_tokens"),
    ],
)
def test_prediction_dropped_with_conflicting_feature(
    gateway_url: str, standin: StandIn, extra: dict[str, object], reason: str
) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        prediction={"type": "content", "content": PREDICTED},
        **extra,  # type: ignore[arg-type]
    )
    assert raw.headers["x-draftgate-prediction"] == f"dropped:{reason}"
    body = standin.requests[-1].body
    assert "prediction" not in body
    assert all(body[k] == v for k, v in extra.items())


def test_extension_stripped_and_unknown_fields_pass_through(
    gateway_url: str, standin: StandIn
) -> None:
    client(gateway_url).chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        extra_body={"draftgate": {"draft": True}, "vendor_knob": {"x": [1, 2]}},
    )
    body = standin.requests[-1].body
    assert "draftgate" not in body
    assert body["vendor_knob"] == {"x": [1, 2]}


def test_body_untouched_when_nothing_changes(gateway_url: str, standin: StandIn) -> None:
    raw = json.dumps({"model": "gpt-4o-mini", "messages": MESSAGES, "zeta": 1, "alpha": None})
    r = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        content=raw,
        headers={"authorization": "Bearer alice-key", "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert list(standin.requests[-1].body) == ["model", "messages", "zeta", "alpha"]


def test_prediction_synthesized_from_document(gateway_url: str, standin: StandIn) -> None:
    auth = {"authorization": "Bearer alice-key"}
    r = httpx.post(
        f"{gateway_url}/v1/documents", json={"id": "src/add.py", "text": PREDICTED}, headers=auth
    )
    assert r.status_code == 201, r.text
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        extra_headers={"X-Draftgate-Documents": "src%2Fadd.py"},
    )
    assert raw.headers["x-draftgate-prediction"] == "synthesized"
    assert standin.requests[-1].body["prediction"] == {"type": "content", "content": PREDICTED}
    # the same through the body extension
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        extra_body={"draftgate": {"documents": ["src/add.py"]}},
    )
    assert raw.headers["x-draftgate-prediction"] == "synthesized"
    assert "draftgate" not in standin.requests[-1].body


def test_synthesis_needs_the_tenants_own_document(gateway_url: str, standin: StandIn) -> None:
    httpx.post(
        f"{gateway_url}/v1/documents",
        json={"id": "bob-only.py", "text": PREDICTED},
        headers={"authorization": "Bearer bob-key"},
    ).raise_for_status()
    raw = client(gateway_url, "alice-key").chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        extra_body={"draftgate": {"documents": ["bob-only.py"]}},
    )
    assert raw.headers["x-draftgate-prediction"] == "dropped:no-document"
    assert "prediction" not in standin.requests[-1].body


def test_no_synthesis_for_engine_without_predictions(gateway_url: str, standin: StandIn) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="llama", messages=MESSAGES, extra_body={"draftgate": {"documents": ["x.py"]}}
    )
    assert raw.headers["x-draftgate-prediction"] == "dropped:unsupported"
    assert "prediction" not in standin.requests[-1].body


def test_credentials_and_headers(gateway_url: str, standin: StandIn) -> None:
    client(gateway_url).chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        extra_headers={"X-Request-Id": "req-7", "X-Secret": "s"},
    )
    headers = standin.requests[-1].headers
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert headers["host"] != httpx.URL(gateway_url).netloc.decode()
    assert headers["x-request-id"] == "req-7"
    assert "x-secret" not in headers


def test_azure_adapter(gateway_url: str, standin: StandIn) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="azure-gpt-4o", messages=MESSAGES, prediction={"type": "content", "content": "x"}
    )
    assert raw.headers["x-draftgate-prediction"] == "passed"
    seen = standin.requests[-1]
    assert seen.path == "/openai/deployments/gpt-4o/chat/completions"
    assert seen.query == "api-version=2025-01-01-preview"
    assert seen.headers["api-key"] == UPSTREAM_KEY
    assert "authorization" not in seen.headers


def test_429_retried_after_retry_after(gateway_url: str, standin: StandIn) -> None:
    answer = client(gateway_url).chat.completions.create(model="rate-limited", messages=MESSAGES)
    assert answer.choices[0].message.content == ANSWER
    assert len(standin.requests) == 2
    assert standin.retry_gap_s() >= 1.0


def test_persistent_429_reaches_the_client_with_retry_after(
    gateway_url: str, standin: StandIn
) -> None:
    with pytest.raises(openai.RateLimitError) as err:
        client(gateway_url).chat.completions.create(model="always-429", messages=MESSAGES)
    assert len(standin.requests) == 3  # the first try and two retries
    assert err.value.response.headers["retry-after"] == "1"


def test_503_retried(gateway_url: str, standin: StandIn) -> None:
    answer = client(gateway_url).chat.completions.create(model="flaky", messages=MESSAGES)
    assert answer.choices[0].message.content == ANSWER
    assert len(standin.requests) == 2


def test_fallback_to_next_endpoint(gateway_url: str, standin: StandIn) -> None:
    raw = client(gateway_url).chat.completions.with_raw_response.create(
        model="failover", messages=MESSAGES
    )
    assert raw.headers["x-draftgate-endpoint"] == "openai"
    assert raw.parse().choices[0].message.content == ANSWER


def test_persistent_5xx_becomes_502(gateway_url: str, standin: StandIn) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client(gateway_url).chat.completions.create(model="always-500", messages=MESSAGES)
    assert err.value.status_code == 502
    assert "The server had an error" in err.value.message
    assert len(standin.requests) == 1  # 500 is not retried


def test_upstream_client_error_passed_back(gateway_url: str, standin: StandIn) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(gateway_url).chat.completions.create(model="bad-request", messages=MESSAGES)
    assert "temperature" in err.value.message


def test_upstream_message_never_leaks_the_key(gateway_url: str, standin: StandIn) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client(gateway_url).chat.completions.create(model="leaky-401", messages=MESSAGES)
    assert err.value.status_code == 502
    assert UPSTREAM_KEY not in err.value.response.text
    assert "Incorrect API key" in err.value.message


def test_upstream_timeout_becomes_504(gateway_url: str, standin: StandIn) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client(gateway_url).chat.completions.create(model="slow-headers", messages=MESSAGES)
    assert err.value.status_code == 504


def test_stream_cut_midway_ends_with_error_event(gateway_url: str, standin: StandIn) -> None:
    stream = client(gateway_url).chat.completions.create(
        model="stream-cut", messages=MESSAGES, stream=True
    )
    text = ""
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    assert text == "".join(tokens(ANSWER)[:2])  # what arrived before the cut was forwarded
    assert "interrupted" in str(err.value)
