"""Client and AsyncClient against a real uvicorn server running the stand-in app."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from sdk import AsyncClient, Client
from sdk.errors import BadRequestError, NotFoundError
from sdk.wire import ChatCompletion, ChatCompletionChunk, Completion, DocumentInfo
from tests.openai_standin import StandIn

MESSAGES = [{"role": "user", "content": "Say hello."}]


def test_chat_sends_only_what_was_set_and_parses_the_answer(
    base_url: str, standin: StandIn
) -> None:
    with Client(base_url, "sk-1") as client:
        answer = client.chat(
            model="standin", messages=MESSAGES, prediction="Hello", documents=["a.py"], seed=3
        )
    assert isinstance(answer, ChatCompletion)
    assert answer.choices[0].message.content == "Hello there."
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    details = answer.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens == 1
    assert standin.bodies() == [
        {
            "model": "standin",
            "messages": MESSAGES,
            "seed": 3,
            "prediction": {"type": "content", "content": "Hello"},
            "draftgate": {"documents": ["a.py"]},
        }
    ]
    assert standin.requests[0].headers["authorization"] == "Bearer sk-1"


def test_documents_join_other_draftgate_options(base_url: str, standin: StandIn) -> None:
    with Client(base_url) as client:
        client.chat(
            model="standin", messages=MESSAGES, documents=["a", "b"], draftgate={"draft": False}
        )
    assert standin.bodies()[0]["draftgate"] == {"draft": False, "documents": ["a", "b"]}


def test_chat_stream_yields_typed_chunks(base_url: str, standin: StandIn) -> None:
    with (
        Client(base_url) as client,
        client.chat(
            model="standin", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        ) as stream,
    ):
        chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there."
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert standin.bodies()[0]["stream"] is True


async def test_async_chat_and_stream(base_url: str, standin: StandIn) -> None:
    async with AsyncClient(base_url) as client:
        answer = await client.chat(model="standin", messages=MESSAGES)
        stream = await client.chat(model="standin", messages=MESSAGES, stream=True)
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert answer.choices[0].message.content == "Hello there."
    assert "".join(pieces) == "Hello there."


def test_stream_closed_early_releases_the_connection(base_url: str, standin: StandIn) -> None:
    standin.script.reply = lambda body: "word " * 200
    with Client(base_url) as client:
        with client.chat(model="standin", messages=MESSAGES, stream=True) as stream:
            first = next(stream)
        assert stream.response.is_closed
        assert first.choices[0].delta.role == "assistant"
        assert client.models().data[0].id == "standin"


def test_completions_plain_and_streamed(base_url: str, standin: StandIn) -> None:
    standin.script.reply = lambda body: f"echo: {body['prompt']}"
    with Client(base_url) as client:
        done = client.complete(model="standin", prompt="abc", max_tokens=10)
        with client.complete(model="standin", prompt="xyz", stream=True) as stream:
            chunks = list(stream)
    assert isinstance(done, Completion) and done.choices[0].text == "echo: abc"
    assert "".join(c.choices[0].text for c in chunks) == "echo: xyz"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_invalid_parameters_fail_before_sending(base_url: str, standin: StandIn) -> None:
    with Client(base_url) as client, pytest.raises(pydantic.ValidationError, match="temperature"):
        client.chat(model="standin", messages=MESSAGES, temperature=5)
    assert standin.bodies() == []


def test_server_side_400_is_typed(base_url: str, standin: StandIn) -> None:
    with Client(base_url) as client, pytest.raises(BadRequestError) as caught:
        client._send("POST", "chat/completions", json={"model": "standin", "messages": []})
    assert caught.value.error.type == "invalid_request_error"


def test_documents_round_trip(base_url: str, standin: StandIn) -> None:
    with Client(base_url) as client:
        info = client.documents.put(
            "src/app.py", "print(1)\n", path="src/app.py", language="python"
        )
        assert isinstance(info, DocumentInfo) and info.bytes == 9
        assert client.documents.get("src/app.py").text == "print(1)\n"
        assert [d.id for d in client.documents.list()] == ["src/app.py"]
        client.documents.delete("src/app.py")
        assert client.documents.list() == []
        with pytest.raises(NotFoundError):
            client.documents.get("src/app.py")
        with pytest.raises(NotFoundError):
            client.documents.delete("src/app.py")


async def test_put_dir_respects_gitignore_and_skips_binary_and_large(
    base_url: str, standin: StandIn, tmp_path: Path
) -> None:
    (tmp_path / ".gitignore").write_text("build/\n*.log\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('app')\n")
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gen.py").write_text("generated\n")
    (tmp_path / "run.log").write_text("log\n")
    (tmp_path / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    (tmp_path / "big.txt").write_text("x" * 2000)
    async with AsyncClient(base_url) as client:
        stored = await client.documents.put_dir(tmp_path, max_bytes=1000)
        listed = await client.documents.list()
        app = await client.documents.get("src/app.py")
    assert sorted(d.id for d in stored) == [".gitignore", "src/app.py"]
    assert sorted(d.id for d in listed) == [".gitignore", "src/app.py"]
    assert app.language == "python" and app.path == "src/app.py"


def test_endpoints_and_audit(base_url: str, standin: StandIn) -> None:
    with Client(base_url) as client:
        records = client.endpoints()
        result = client.audit("standin", concurrency=[1, 4], requests=2)
        with pytest.raises(NotFoundError):
            client.audit("nope")
        with pytest.raises(pydantic.ValidationError):
            client.audit("standin", concurency=[1])  # misspelt option: refused before sending
    assert records[0].name == "standin" and records[0].enabled == "unknown"
    assert result.summary == {"concurrency": [1, 4], "requests": 2}
