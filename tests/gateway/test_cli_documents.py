"""``draftgate index`` and ``draftgate documents ls|rm`` against a real Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from lookup.corpus import Corpus, open_store

pytestmark = pytest.mark.redis


def _tree(root: Path) -> None:
    files = {
        ".gitignore": "build/\n*.log\n",
        "a.py": "print('a')\n",
        "sub/.gitignore": "secret.txt\n!keep.log\n",
        "sub/b.md": "# B\n",
        "sub/.env": "API_KEY=not-for-the-corpus\n",
        "sub/keep.log": "kept by the nested .gitignore\n",
        "sub/secret.txt": "ignored by the nested .gitignore\n",
        "build/out.py": "ignored directory\n",
        "debug.log": "ignored file\n",
        "big.txt": "x" * 2000,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))


def _ids(redis_url: str, prefix: str, ns: str) -> dict[str, str | None]:
    async def run() -> dict[str, str | None]:
        corpus = Corpus(open_store(redis_url, prefix=prefix, timeout_s=2.0))
        try:
            return {m.id: m.language for m in await corpus.list(ns)}
        finally:
            await corpus.aclose()

    return asyncio.run(run())


def _run(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


def test_index_uploads_text_files_and_summarises(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: object
) -> None:
    _tree(tmp_path)
    opts = ["--redis-url", redis_url, "--prefix", redis_prefix]
    result = _run("index", str(tmp_path), "-n", "team", *opts, "--max-file-bytes", "1000")
    assert result.exit_code == 0, result.output
    assert "Indexed 5 files" in result.output
    assert "skipped: 2 binary, 3 ignored, 1 secret, 1 too large" in result.output
    assert "holds 5 documents" in result.output
    assert _ids(redis_url, redis_prefix, "team") == {
        ".gitignore": None,
        "a.py": "python",
        "sub/.gitignore": None,
        "sub/b.md": "markdown",
        "sub/keep.log": None,
    }
    assert _ids(redis_url, redis_prefix, "other") == {}

    listed = _run("documents", "ls", "-n", "team", *opts)
    assert listed.exit_code == 0
    assert all(i in listed.output for i in ("a.py", "sub/b.md", "5 documents"))

    removed = _run("documents", "rm", "a.py", "missing.py", "-n", "team", *opts)
    assert removed.exit_code == 1
    assert "removed: a.py" in removed.output and "not found: missing.py" in removed.output
    assert "a.py" not in _ids(redis_url, redis_prefix, "team")


def test_index_one_file_with_progress_bar(
    tmp_path: Path, redis_url: str, redis_prefix: str, redis_client: object
) -> None:
    (tmp_path / "one.rs").write_text("fn main() {}\n")
    result = _run(
        "index", str(tmp_path / "one.rs"), "-n", "t", "--redis-url", redis_url,
        "--prefix", redis_prefix, "--progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1/1" in result.output  # the progress bar
    assert _ids(redis_url, redis_prefix, "t") == {"one.rs": "rust"}


def test_no_redis_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    result = _run("documents", "ls", "-n", "t")
    assert result.exit_code == 2
    assert "pass --redis-url or set REDIS_URL" in result.output


def test_unreachable_redis_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    result = _run("index", str(tmp_path), "-n", "t", "--redis-url", "redis://127.0.0.1:1/0")
    assert result.exit_code == 1
    assert "document store unavailable" in result.output
    assert "Traceback" not in result.output
