"""edit / edit_file end to end against a real uvicorn server running the stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sdk import AsyncClient, Client, EditDelta, EditResult
from sdk.edits import default_max_tokens, fenced
from sdk.errors import (
    APIConnectionError,
    APIStreamError,
    BinaryFileError,
    FileTooLargeError,
    IncompleteEditError,
    NotRegularFileError,
)
from tests.openai_standin import StandIn

ORIGINAL = "def greet(name):\n    return 'hi ' + name\n\n\ndef main():\n    print(greet('bob'))\n"
EDITED = ORIGINAL.replace("greet", "welcome")


def renaming_reply(body: dict[str, Any]) -> str:
    """What a well-behaved model answers: the predicted code, edited, with text around."""
    code = body["prediction"]["content"]
    return "Here you go:\n\n" + code.replace("greet", "welcome") + "\n\nRenamed the function."


@pytest.fixture
def renaming(standin: StandIn) -> StandIn:
    standin.script.reply = renaming_reply
    return standin


def test_edit_sends_the_code_as_prediction_and_returns_the_result(
    base_url: str, renaming: StandIn
) -> None:
    with Client(base_url) as client:
        result = client.edit(
            ORIGINAL,
            "rename greet to welcome",
            model="standin",
            language="python",
            documents=["lib.py"],
        )
    assert result.code == EDITED
    assert "-def greet(name):\n+def welcome(name):\n" in result.diff
    assert result.finish_reason == "stop" and result.raw.startswith("Here you go:")
    assert result.prediction is None  # a plain OpenAI-compatible server does not say
    assert result.usage is not None
    assert result.usage.accepted_prediction_tokens and result.usage.accepted_prediction_tokens > 20
    assert result.usage.rejected_prediction_tokens == 2  # the two "greet" tokens
    assert result.timings.ttft_s is not None and result.timings.tokens_per_s is not None
    sent = renaming.bodies()[0]
    assert sent["prediction"] == {"type": "content", "content": fenced(ORIGINAL, "python")}
    assert sent["draftgate"] == {"documents": ["lib.py"]}
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["temperature"] == 0.0
    assert "rename greet to welcome" in sent["messages"][-1]["content"]


def test_edit_passes_sampling_options(base_url: str, renaming: StandIn) -> None:
    with Client(base_url) as client:
        client.edit(ORIGINAL, "x", model="standin", temperature=0.7, seed=1, max_tokens=500)
    sent = renaming.bodies()[0]
    assert (sent["temperature"], sent["seed"], sent["max_tokens"]) == (0.7, 1, 500)


def test_edit_stream_yields_deltas_then_the_result(base_url: str, renaming: StandIn) -> None:
    with Client(base_url) as client:
        items = list(client.edit(ORIGINAL, "rename", model="standin", stream=True))
    *deltas, result = items
    assert deltas and all(isinstance(d, EditDelta) for d in deltas)
    assert isinstance(result, EditResult) and result.code == EDITED
    assert "".join(d.text for d in deltas) == result.raw
    assert [d.elapsed_s for d in deltas] == sorted(d.elapsed_s for d in deltas)


async def test_async_edit_and_stream(base_url: str, renaming: StandIn) -> None:
    async with AsyncClient(base_url) as client:
        result = await client.edit(ORIGINAL, "rename", model="standin")
        items = [
            item
            async for item in await client.edit(ORIGINAL, "rename", model="standin", stream=True)
        ]
    assert result.code == EDITED
    assert isinstance(items[-1], EditResult) and items[-1].code == EDITED
    assert all(isinstance(i, EditDelta) for i in items[:-1])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "greet.py"
    path.write_text(ORIGINAL)
    return path


def test_edit_file_writes_atomically_with_backup(
    base_url: str, renaming: StandIn, source: Path
) -> None:
    with Client(base_url) as client:
        result = client.edit_file(source, "rename", model="standin")
    assert source.read_text() == EDITED
    assert result.written and result.path == source
    assert (
        result.backup == source.with_name("greet.py.bak") and result.backup.read_text() == ORIGINAL
    )
    assert result.diff.startswith("--- a/greet.py\n+++ b/greet.py\n")
    assert sorted(p.name for p in source.parent.iterdir()) == ["greet.py", "greet.py.bak"]
    assert renaming.bodies()[0]["prediction"]["content"].startswith("```python\n")


def test_edit_file_dry_run_and_no_backup(base_url: str, renaming: StandIn, source: Path) -> None:
    with Client(base_url) as client:
        dry = client.edit_file(source, "rename", model="standin", dry_run=True)
        assert source.read_text() == ORIGINAL and not dry.written and dry.changed
        done = client.edit_file(source, "rename", model="standin", backup=False)
    assert done.written and done.backup is None
    assert source.read_text() == EDITED
    assert [p.name for p in source.parent.iterdir()] == ["greet.py"]


def test_edit_file_unchanged_answer_writes_nothing(
    base_url: str, standin: StandIn, source: Path
) -> None:
    standin.script.reply = lambda body: body["prediction"]["content"]
    before = source.stat().st_mtime_ns
    with Client(base_url) as client:
        result = client.edit_file(source, "nothing to do", model="standin")
    assert not result.changed and not result.written and result.diff == ""
    assert source.stat().st_mtime_ns == before
    assert [p.name for p in source.parent.iterdir()] == ["greet.py"]


def assert_intact(source: Path) -> None:
    assert source.read_text() == ORIGINAL
    assert [p.name for p in source.parent.iterdir()] == ["greet.py"]  # no temp file, no backup


def test_stream_broken_mid_way_leaves_the_file_intact(
    base_url: str, renaming: StandIn, source: Path
) -> None:
    renaming.script.break_after = 12
    seen: list[str] = []
    with Client(base_url, max_retries=2) as client, pytest.raises(APIConnectionError):
        for item in client.edit_file(source, "rename", model="standin", stream=True):
            assert isinstance(item, EditDelta)
            seen.append(item.text)
    assert len(seen) == 12  # the break happened mid-way, after real progress
    assert len(renaming.requests) == 1  # never retried once the body was being read
    assert_intact(source)


async def test_async_stream_broken_mid_way_leaves_the_file_intact(
    base_url: str, renaming: StandIn, source: Path
) -> None:
    renaming.script.break_after = 5
    async with AsyncClient(base_url, max_retries=0) as client:
        with pytest.raises(APIConnectionError):
            await client.edit_file(source, "rename", model="standin")
    assert_intact(source)


def test_error_event_mid_stream_leaves_the_file_intact(
    base_url: str, renaming: StandIn, source: Path
) -> None:
    renaming.script.error_after = 7
    with Client(base_url) as client, pytest.raises(APIStreamError) as caught:
        client.edit_file(source, "rename", model="standin")
    assert (
        caught.value.body is not None and caught.value.body.error.code == "upstream_stream_broken"
    )
    assert_intact(source)


def test_truncated_answer_is_refused(base_url: str, renaming: StandIn, source: Path) -> None:
    with Client(base_url) as client, pytest.raises(IncompleteEditError, match="length"):
        client.edit_file(source, "rename", model="standin", max_tokens=10)
    assert_intact(source)


def test_binary_and_oversized_files_are_refused_before_sending(
    base_url: str, standin: StandIn, tmp_path: Path
) -> None:
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    large = tmp_path / "large.py"
    large.write_text("x = 1\n" * 1000)
    with Client(base_url) as client:
        with pytest.raises(BinaryFileError):
            client.edit_file(binary, "x", model="standin")
        with pytest.raises(FileTooLargeError, match="6000 bytes"):
            client.edit_file(large, "x", model="standin", max_bytes=4096)
    assert standin.bodies() == []


def test_edit_caps_the_answer_at_twice_the_code_by_default(base_url: str, standin: StandIn) -> None:
    """A runaway answer (the code over and over) stops at the default cap with a clear error."""
    standin.script.reply = lambda body: body["prediction"]["content"] * 200
    with Client(base_url) as client, pytest.raises(IncompleteEditError, match="max_tokens=") as err:
        client.edit(ORIGINAL, "rename greet to welcome", model="standin", language="python")
    cap = default_max_tokens(fenced(ORIGINAL, "python"))
    assert standin.bodies()[0]["max_tokens"] == cap
    assert err.value.completion_tokens == cap
    assert len(err.value.raw) < len(fenced(ORIGINAL, "python")) * 200


def test_an_explicit_limit_replaces_the_default_cap(base_url: str, renaming: StandIn) -> None:
    with Client(base_url) as client:
        client.edit(ORIGINAL, "x", model="standin", max_completion_tokens=900)
    sent = renaming.bodies()[0]
    assert sent["max_completion_tokens"] == 900 and "max_tokens" not in sent


def test_edit_file_refuses_a_symlink_and_leaves_it(
    base_url: str, renaming: StandIn, tmp_path: Path
) -> None:
    real = tmp_path / "real.py"
    real.write_text(ORIGINAL)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    with Client(base_url) as client, pytest.raises(NotRegularFileError, match="symbolic link"):
        client.edit_file(link, "rename greet to welcome", model="standin")
    assert link.is_symlink() and real.read_text() == ORIGINAL
    assert renaming.bodies() == []  # refused before anything was sent


def test_put_dir_skips_secrets_unless_asked_and_survives_a_bad_gitignore(
    base_url: str, standin: StandIn, tmp_path: Path
) -> None:
    (tmp_path / ".gitignore").write_text("[z-a]\n*.log\n")
    (tmp_path / ".env").write_text("API_KEY=secret\n")
    (tmp_path / "app.py").write_text("x = 1\n")
    (tmp_path / "debug.log").write_text("noise\n")
    with Client(base_url) as client:
        ids = {d.id for d in client.documents.put_dir(tmp_path)}
        assert ids == {".gitignore", "app.py"}
        ids = {d.id for d in client.documents.put_dir(tmp_path, include_secrets=True)}
        assert ids == {".gitignore", ".env", "app.py"}
