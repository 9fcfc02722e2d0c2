"""Code-edit building blocks: the prompt, code extraction, diffs, file safety."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from sdk.edits import (
    EditSession,
    default_max_tokens,
    edit_messages,
    extract_code,
    fenced,
    read_source,
    unified_diff,
    write_atomic,
)
from sdk.errors import (
    BinaryFileError,
    EditError,
    FileTooLargeError,
    IncompleteEditError,
    NotRegularFileError,
)
from sdk.wire import ChatCompletionChunk

ORIGINAL = "def add(a, b):\n    return a + b\n"
EDITED = "def add(a: int, b: int) -> int:\n    return a + b\n"


def test_prompt_fences_the_code_and_prediction_has_the_answer_shape() -> None:
    messages = edit_messages(ORIGINAL, "add type hints", "python")
    assert messages[0]["role"] == "system" and "fenced code block" in messages[0]["content"]
    assert "add type hints" in messages[1]["content"]
    assert fenced(ORIGINAL, "python") in messages[1]["content"]
    assert fenced(ORIGINAL, "python") == "```python\n" + ORIGINAL + "```"


def test_fence_is_longer_than_any_fence_inside_the_code() -> None:
    markdown = "# doc\n```sh\nls\n```\n"
    block = fenced(markdown, "markdown")
    assert block.startswith("````markdown\n") and block.endswith("\n````")
    assert extract_code(block, markdown, "markdown") == markdown


@pytest.mark.parametrize(
    "answer",
    [
        EDITED,
        "def add(a: int, b: int) -> int:\n    return a + b",
        "\n\ndef add(a: int, b: int) -> int:\n    return a + b\n\n",
        "```python\n" + EDITED + "```",
        "Here is the updated code:\n\n```python\n" + EDITED + "```\n\nI added type hints.",
        "```\n" + EDITED + "```",
        "~~~python\n" + EDITED + "~~~\n",
        "Sure:\n```python\n" + EDITED,  # unclosed fence (the model forgot to close it)
        "Install with:\n```bash\npip install x\n```\nThen:\n```python\n" + EDITED + "```\n",
        "Before:\n```python\n" + ORIGINAL + "```\nAfter:\n```python\n" + EDITED + "```\n",
        "```python\n" + EDITED + "```\nUsage:\n```python\nprint(add(1, 2))\n```\n",
    ],
    ids=[
        "bare",
        "bare-no-newline",
        "bare-blank-lines",
        "fenced",
        "text-around",
        "untagged",
        "tildes",
        "unclosed",
        "other-language-first",
        "before-and-after",
        "usage-snippet-after",
    ],
)
def test_extract_code(answer: str) -> None:
    assert extract_code(answer, ORIGINAL, "python") == EDITED


def test_extract_keeps_the_originals_end_of_line_conventions() -> None:
    assert extract_code("```\nx = 1\n```", "x = 0") == "x = 1"
    assert extract_code("```\nx = 1\ny = 2\n```", "x = 0\r\ny = 0\r\n") == "x = 1\r\ny = 2\r\n"


def test_unified_diff_applies_with_git(tmp_path: Path) -> None:
    before, after = "a\nb\nc", "a\nB\nc\nd\n"
    (tmp_path / "f.txt").write_text(before)
    patch = unified_diff(before, after, "f.txt")
    assert "\\ No newline at end of file" in patch
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=patch.encode(), check=True)
    assert (tmp_path / "f.txt").read_text() == after
    assert unified_diff(before, before) == ""


def _chunk(
    content: str | None = None, finish: str | None = None, usage: dict | None = None
) -> ChatCompletionChunk:
    choices = (
        [] if usage else [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    )
    return ChatCompletionChunk.model_validate(
        {"id": "c", "created": 1, "model": "m", "choices": choices, "usage": usage}
    )


def test_session_turns_chunks_into_deltas_and_a_result() -> None:
    session = EditSession(ORIGINAL, "add type hints", language="python", name="add.py")
    assert session.sampling["temperature"] == 0.0
    assert session.sampling["stream_options"] == {"include_usage": True}
    answer = "```python\n" + EDITED + "```"
    deltas = [session.feed(_chunk(piece)) for piece in (answer[:10], answer[10:])]
    assert [d.text for d in deltas if d] == [answer[:10], answer[10:]]
    assert session.feed(_chunk(finish="stop")) is None
    usage = {
        "prompt_tokens": 30,
        "completion_tokens": 20,
        "total_tokens": 50,
        "completion_tokens_details": {
            "accepted_prediction_tokens": 15,
            "rejected_prediction_tokens": 2,
        },
    }
    session.feed(_chunk(usage=usage))
    result = session.result()
    assert result.code == EDITED
    assert result.raw == answer
    assert result.diff.startswith("--- a/add.py\n+++ b/add.py\n")
    assert result.usage is not None
    assert (result.usage.accepted_prediction_tokens, result.usage.rejected_prediction_tokens) == (
        15,
        2,
    )
    timings = result.timings
    assert timings.ttft_s is not None and 0 <= timings.ttft_s <= timings.total_s
    assert timings.tokens_per_s is not None and timings.tokens_per_s > 0


def test_session_without_usage_reports_none() -> None:
    session = EditSession(ORIGINAL, "noop")
    session.feed(_chunk(ORIGINAL, finish="stop"))
    result = session.result()
    assert result.usage is None and result.timings.tokens_per_s is None
    assert not result.changed


@pytest.mark.parametrize("finish", ["length", None])
def test_session_refuses_an_answer_that_did_not_stop(finish: str | None) -> None:
    session = EditSession(ORIGINAL, "x")
    session.feed(_chunk("def add(a", finish=finish))
    with pytest.raises(IncompleteEditError, match="finish_reason"):
        session.result()


def test_read_source_refuses_binary_large_and_non_utf8(tmp_path: Path) -> None:
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\x7fELF\0\0\x01")
    with pytest.raises(BinaryFileError, match="NUL"):
        read_source(binary, 1 << 20)
    latin = tmp_path / "l.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(BinaryFileError, match="UTF-8"):
        read_source(latin, 1 << 20)
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 100)
    with pytest.raises(FileTooLargeError, match="600 bytes"):
        read_source(big, 599)
    assert read_source(big, 600) == "x = 1\n" * 100


def test_write_atomic_keeps_mode_and_backup(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text("echo old\n")
    os.chmod(path, 0o750)
    backup = write_atomic(path, "echo new\n", expected="echo old\n", backup=True)
    assert path.read_text() == "echo new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert backup == tmp_path / "run.sh.bak" and backup.read_text() == "echo old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sh", "run.sh.bak"]


def test_write_atomic_refuses_a_file_changed_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("changed by someone else\n")
    with pytest.raises(EditError, match="changed on disk"):
        write_atomic(path, "new\n", expected="original\n", backup=False)
    assert path.read_text() == "changed by someone else\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.py"]


def test_write_atomic_failure_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "bad \udcff surrogate\n", expected="old\n", backup=False)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.py"]


def test_default_max_tokens_is_about_twice_the_code_plus_headroom() -> None:
    code = "x = 1\n" * 100  # 600 bytes: ~150-200 tokens with a BPE tokenizer
    assert default_max_tokens(code) == 2 * 200 + 256
    assert default_max_tokens("") == 256
    assert default_max_tokens("é" * 3) == 2 * 2 + 256  # bytes, not characters


def test_read_source_refuses_symlinks_and_fifos(tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_text("x = 1\n")
    (tmp_path / "link.py").symlink_to(real)
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        read_source(tmp_path / "link.py", 1 << 20)
    os.mkfifo(tmp_path / "pipe.py")
    with pytest.raises(NotRegularFileError, match="FIFO"):
        read_source(tmp_path / "pipe.py", 1 << 20)  # no writer: returns at once


def test_backup_replaces_a_bak_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    path = tmp_path / "a.py"
    path.write_text("old\n")
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("must stay\n")
    (tmp_path / "a.py.bak").symlink_to(elsewhere)
    backup = write_atomic(path, "new\n", expected="old\n", backup=True)
    assert backup is not None and not backup.is_symlink() and backup.read_text() == "old\n"
    assert elsewhere.read_text() == "must stay\n"
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "a.py.bak", "elsewhere.txt"]
