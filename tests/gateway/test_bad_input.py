"""Each kind of bad input gets its OpenAI-style error JSON and status."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.openai_standin import StandIn

AUTH = {"authorization": "Bearer alice-key"}


def post(url: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        content=content,
        headers={**AUTH, "content-type": "application/json", **(headers or {})},
    )


def error_of(response: httpx.Response) -> dict[str, object]:
    assert response.headers["content-type"] == "application/json"
    assert "x-draftgate-overhead-ms" in response.headers
    assert response.headers["x-draftgate-prediction"] == "none"
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert "Traceback" not in str(error["message"])
    return error  # type: ignore[no-any-return]


def test_invalid_json(gateway_url: str) -> None:
    r = post(gateway_url, b'{"model": "gpt-4o-mini", "messages": [')
    assert r.status_code == 400
    assert error_of(r)["code"] == "invalid_json"


def test_body_not_an_object(gateway_url: str) -> None:
    r = post(gateway_url, b"[1, 2]")
    assert r.status_code == 400
    assert error_of(r)["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "gpt-4o-mini"}', "messages"),
        (b'{"model": "gpt-4o-mini", "messages": []}', "messages"),
        (b'{"model": "gpt-4o-mini", "messages": [{"content": "hi"}]}', "messages.0.role"),
        (
            b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "temperature": 9}',
            "temperature",
        ),
        (
            b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
            "max_tokens",
        ),
        (
            b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "stream": "maybe"}',
            "stream",
        ),
    ],
)
def test_missing_or_invalid_field_is_named(gateway_url: str, body: bytes, field: str) -> None:
    r = post(gateway_url, body)
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == field
    assert str(error["message"]).startswith(field)


def test_completions_missing_prompt(gateway_url: str) -> None:
    r = httpx.post(f"{gateway_url}/v1/completions", json={"model": "gpt-4o-mini"}, headers=AUTH)
    assert r.status_code == 400
    assert error_of(r)["param"] == "prompt"


def test_unknown_model(gateway_url: str) -> None:
    c = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="alice-key", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        c.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert err.value.code == "model_not_found"


def test_body_over_limit(gateway_url: str, standin: StandIn) -> None:
    huge = (
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "'
        + b"x" * (9 << 20)
        + b'"}]}'
    )
    r = post(gateway_url, huge)
    assert r.status_code == 413
    assert error_of(r)["code"] == "payload_too_large"
    assert standin.requests == []


def test_body_over_limit_without_content_length(gateway_url: str, standin: StandIn) -> None:
    def chunks():  # chunked transfer: the limit is enforced while reading
        yield b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "'
        for _ in range(9):
            yield b"x" * (1 << 20)
        yield b'"}]}'

    r = httpx.post(
        f"{gateway_url}/v1/chat/completions",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 413
    assert standin.requests == []


def test_unknown_key(gateway_url: str) -> None:
    c = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}])


def test_missing_key(gateway_url: str) -> None:
    r = httpx.get(f"{gateway_url}/v1/models")
    assert r.status_code == 401
    assert error_of(r)["type"] == "authentication_error"


def test_unknown_route_is_json(gateway_url: str) -> None:
    r = httpx.get(f"{gateway_url}/v1/nothing-here", headers=AUTH)
    assert r.status_code == 404
    assert error_of(r)["code"] == "not_found"


def test_wrong_method_is_json(gateway_url: str) -> None:
    r = httpx.get(f"{gateway_url}/v1/chat/completions", headers=AUTH)
    assert r.status_code == 405
    error_of(r)


def test_other_methods_on_the_completion_paths(gateway_url: str) -> None:
    for path in ("chat/completions", "completions"):
        r = httpx.get(f"{gateway_url}/v1/{path}", headers=AUTH)
        assert r.status_code == 405
        assert error_of(r)["code"] == "method_not_allowed"
