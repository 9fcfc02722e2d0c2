"""The SDK against the real gateway app.

In process (``httpx.ASGITransport``, with the app's lifespan) for plain requests, and in
a real uvicorn server for streams. The gateway's upstream is the stand-in (a real server
speaking OpenAI's wire format); the slow test runs an edit on the local SmolLM2 endpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import EndpointConfig, KeyConfig, Settings
from sdk import AsyncClient, Client, EditResult
from sdk.edits import default_max_tokens, fenced
from sdk.errors import (
    APIStreamError,
    AuthenticationError,
    BadRequestError,
    IncompleteEditError,
    NotFoundError,
    PayloadTooLargeError,
)
from tests.gateway.servers import serve
from tests.openai_standin import StandIn

KEY = "sdk-test-key"
MAX_BODY = 64 * 1024
CODE = "def greet(name):\n    return 'hi ' + name\n\n\nprint(greet('bob'))\n"


def gateway_settings(upstream: str) -> Settings:
    endpoint = EndpointConfig(
        name="standin",
        kind="openai_compatible",
        base_url=upstream + "/v1",
        models=["standin"],
        accepts_prediction=True,
        retries=0,
    )
    return Settings(
        endpoints=(endpoint,),
        keys=(KeyConfig(key_env="SDK_TEST_KEY", tenant="sdk"),),
        max_body_bytes=MAX_BODY,
    )


def new_gateway(upstream: str) -> Any:
    return create_app(gateway_settings(upstream), environ={"SDK_TEST_KEY": KEY})


@pytest.fixture
async def gateway(standin_root: str, standin: StandIn) -> AsyncIterator[Any]:
    """A fresh gateway app in process, its lifespan running."""
    app = new_gateway(standin_root)
    async with app.router.lifespan_context(app):
        yield app


def in_process(app: Any, key: str = KEY) -> AsyncClient:
    return AsyncClient("http://gateway/v1", key, transport=httpx.ASGITransport(app), max_retries=0)


@pytest.fixture(scope="module")
def gateway_root(standin_root: str) -> Iterator[str]:
    """The gateway in a real uvicorn server (for streams)."""
    with serve(new_gateway(standin_root)) as url:
        yield url


def renaming_reply(body: dict[str, Any]) -> str:
    return "Done:\n" + body["prediction"]["content"].replace("greet", "welcome") + "\n"


async def test_chat_through_the_gateway_passes_the_prediction(
    gateway: Any, standin: StandIn
) -> None:
    async with in_process(gateway) as client:
        answer = await client.chat(
            model="standin", messages=[{"role": "user", "content": "hi"}], prediction="Hello"
        )
    assert answer.choices[0].message.content == "Hello there."
    details = answer.usage.completion_tokens_details if answer.usage else None
    assert details is not None and details.accepted_prediction_tokens == 1
    assert standin.bodies()[0]["prediction"] == {"type": "content", "content": "Hello"}


async def test_documents_on_the_gateway(gateway: Any, tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.tmp\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "util.py").write_text("def util():\n    return 1\n")
    (tmp_path / "scratch.tmp").write_text("ignored\n")
    async with in_process(gateway) as client:
        info = await client.documents.put("notes/today.md", "# notes\n", language="markdown")
        assert info.bytes == 8 and info.language == "markdown"
        stored = await client.documents.put_dir(tmp_path)
        assert sorted(d.id for d in stored) == [".gitignore", "pkg/util.py"]
        ids = sorted(d.id for d in await client.documents.list())
        assert ids == [".gitignore", "notes/today.md", "pkg/util.py"]
        assert (await client.documents.get("pkg/util.py")).text == "def util():\n    return 1\n"
        await client.documents.delete("notes/today.md")
        with pytest.raises(NotFoundError):
            await client.documents.get("notes/today.md")
        with pytest.raises(NotFoundError):
            await client.documents.delete("notes/today.md")


async def test_gateway_errors_are_typed(gateway: Any, standin: StandIn) -> None:
    messages = [{"role": "user", "content": "hi"}]
    async with in_process(gateway, key="wrong-key") as client:
        with pytest.raises(AuthenticationError) as auth:
            await client.models()
    assert auth.value.error.type == "authentication_error"
    assert "wrong-key" not in str(auth.value)
    async with in_process(gateway) as client:
        with pytest.raises(NotFoundError) as unknown:
            await client.chat(model="no-such-model", messages=messages)
        assert "no-such-model" in unknown.value.error.message
        with pytest.raises(PayloadTooLargeError):
            await client.chat(
                model="standin", messages=[{"role": "user", "content": "x" * MAX_BODY}]
            )
        with pytest.raises(BadRequestError) as bad:
            await client._send(
                "POST", "chat/completions", json={"model": "standin", "messages": []}
            )
        assert bad.value.error.param is not None and "messages" in bad.value.error.param
    assert standin.bodies() == []


def test_stream_through_a_real_gateway_server(gateway_root: str, standin: StandIn) -> None:
    with (
        Client(gateway_root + "/v1", KEY) as client,
        client.chat(
            model="standin", messages=[{"role": "user", "content": "hi"}], stream=True
        ) as stream,
    ):
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello there."


def test_edit_file_through_the_gateway(gateway_root: str, standin: StandIn, tmp_path: Path) -> None:
    standin.script.reply = renaming_reply
    path = tmp_path / "greet.py"
    path.write_text(CODE)
    with Client(gateway_root + "/v1", KEY) as client:
        items = list(
            client.edit_file(path, "rename greet to welcome", model="standin", stream=True)
        )
    result = items[-1]
    assert isinstance(result, EditResult) and result.written
    assert result.prediction == "passed"  # the gateway's X-Draftgate-Prediction
    assert path.read_text() == CODE.replace("greet", "welcome")
    assert result.usage is not None and (result.usage.accepted_prediction_tokens or 0) > 10
    assert standin.bodies()[0]["prediction"]["content"] == "```python\n" + CODE + "```"


def test_upstream_break_mid_edit_leaves_the_file_intact(
    gateway_root: str, standin: StandIn, tmp_path: Path
) -> None:
    standin.script.reply = renaming_reply
    standin.script.break_after = 8
    path = tmp_path / "greet.py"
    path.write_text(CODE)
    with Client(gateway_root + "/v1", KEY, max_retries=0) as client, pytest.raises(APIStreamError):
        client.edit_file(path, "rename greet to welcome", model="standin")
    assert path.read_text() == CODE
    assert [p.name for p in tmp_path.iterdir()] == ["greet.py"]


def test_endpoint_records_and_an_audit_through_the_gateway(
    gateway_root: str, standin: StandIn
) -> None:
    item = {
        "id": "edit-1",
        "category": "code_edit",
        "messages": [{"role": "user", "content": "Rename f to g."}],
        "prediction": "def f():\n    pass\n",
        "max_tokens": 32,
    }
    with Client(gateway_root + "/v1", KEY, max_retries=0) as client:
        records = client.endpoints()
        result = client.audit("standin", workload=[item], concurrency=[1], requests=1)
        with pytest.raises(NotFoundError):
            client.audit("no-such-endpoint", workload=[item])
    assert [r.name for r in records] == ["standin"]
    assert records[0].documented is not None and records[0].documented.source_url
    assert result.endpoint == "standin" and result.finished_at >= result.started_at
    assert result.summary["levels"][0]["concurrency"] == 1
    assert standin.requests  # the audit's requests went through the gateway to the upstream


# ---------------------------------------------------------------- the local SmolLM2 endpoint


@pytest.fixture(scope="module")
def local_gateway(engine: Any) -> Iterator[str]:
    """The gateway with one local endpoint (model name ``smollm2``) on the shared engine."""
    endpoint = EndpointConfig(name="local", kind="local", model="smollm2-135m", models=["smollm2"])
    app = create_app(Settings(endpoints=(endpoint,)), engines={"local": engine})
    with serve(app) as url:
        yield url


@pytest.mark.slow
def test_edit_end_to_end_on_the_local_model(local_gateway: str, tmp_path: Path) -> None:
    path = tmp_path / "calc.py"
    code = "def add(a, b):\n    return a + b\n"
    path.write_text(code)
    with Client(local_gateway + "/v1", timeout=300, max_retries=0) as client:
        items = list(
            client.edit_file(
                path,
                "Rename add to plus.",
                model="smollm2",
                stream=True,
                max_tokens=200,
                dry_run=True,
            )
        )
    *deltas, result = items
    assert deltas and isinstance(result, EditResult)
    assert result.raw == "".join(d.text for d in deltas)
    assert result.code.strip()  # the model's code, extracted from its answer
    assert path.read_text() == code  # dry run
    usage = result.usage
    assert usage is not None and usage.completion_tokens > 0
    # the local verifier reports OpenAI's prediction usage fields
    assert usage.accepted_prediction_tokens is not None
    assert usage.rejected_prediction_tokens is not None
    assert result.timings.ttft_s is not None and result.timings.ttft_s <= result.timings.total_s


SIXTY_LINES = (
    '"""HTTP status codes by name."""\n\n'
    + "STATUS = {\n"
    + "".join(f'    "code_{n}": {200 + n},\n' for n in range(56))
    + "}\n"
)


@pytest.mark.slow
def test_readme_edit_of_a_60_line_file_stops_at_the_default_cap(
    local_gateway: str, tmp_path: Path
) -> None:
    """The README's example as written: it finishes, or stops at ~2x the code, never at the context."""
    path = tmp_path / "util.py"
    path.write_text(SIXTY_LINES)
    assert len(SIXTY_LINES.splitlines()) == 60
    cap = default_max_tokens(fenced(SIXTY_LINES, "python"))
    with Client(local_gateway + "/v1", timeout=600, max_retries=0) as client:
        try:
            result = client.edit_file(path, "Add type hints to every function.", model="smollm2")
        except IncompleteEditError as exc:
            assert "max_tokens=" in str(exc)
            assert exc.completion_tokens is not None and exc.completion_tokens <= cap
            assert path.read_text() == SIXTY_LINES  # nothing written
        else:
            assert result.usage is not None and result.usage.completion_tokens <= cap
