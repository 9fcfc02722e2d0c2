"""Reading a project's files (``sdk.files``): .gitignore, secrets, binaries, size caps,
symlinks and FIFOs; and the one extension -> language table."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sdk.errors import FileTooLargeError, NotRegularFileError
from sdk.files import is_secret, iter_files, read_regular_file, text_of
from sdk.languages import language_for


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def test_walk_reports_texts_and_skip_reasons(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            ".gitignore": "*.tmp\nnode_modules/\n/only_root.txt\n",
            ".git/config": "[core]\n",
            "keep.py": "x = 1\n",
            "scratch.tmp": "ignored\n",
            "only_root.txt": "ignored at the root\n",
            "pkg/only_root.txt": "anchored rule does not apply here\n",
            "node_modules/lib/index.js": "ignored with its directory\n",
            "pkg/.gitignore": "!important.tmp\n",
            "pkg/important.tmp": "re-included by the deeper .gitignore\n",
            "pkg/blob.bin": b"\x00\x01\x02",
            "pkg/big.txt": "y" * 101,
        },
    )
    os.symlink(tmp_path / "keep.py", tmp_path / "link.py")
    found = {f.rel: (f.skipped, f.text) for f in iter_files(tmp_path, max_bytes=100)}
    assert found == {
        ".gitignore": (None, "*.tmp\nnode_modules/\n/only_root.txt\n"),
        "keep.py": (None, "x = 1\n"),
        "scratch.tmp": ("ignored", None),
        "only_root.txt": ("ignored", None),
        "node_modules": ("ignored", None),
        "pkg/.gitignore": (None, "!important.tmp\n"),
        "pkg/only_root.txt": (None, "anchored rule does not apply here\n"),
        "pkg/important.tmp": (None, "re-included by the deeper .gitignore\n"),
        "pkg/blob.bin": ("binary", None),
        "pkg/big.txt": ("too_large", None),
    }


def test_secret_files_are_skipped_unless_asked_for(tmp_path: Path) -> None:
    secrets = [".env", ".env.local", "prod.pem", "id_rsa", "id_ed25519.pub", "conf/server.key"]
    _write(tmp_path, {name: "TOKEN=abc\n" for name in secrets} | {"app.py": "x = 1\n"})
    skipped = {f.rel: f.skipped for f in iter_files(tmp_path, max_bytes=100)}
    assert skipped == {name: "secret" for name in secrets} | {"app.py": None}
    everything = {
        f.rel: f.skipped for f in iter_files(tmp_path, max_bytes=100, include_secrets=True)
    }
    assert set(everything.values()) == {None}
    assert not is_secret("environment.py") and not is_secret("keys.py")


def test_a_gitignore_line_that_does_not_compile_is_passed_over(tmp_path: Path) -> None:
    _write(tmp_path, {".gitignore": "[z-a]\n*.log\n", "a.log": "x\n", "z": "z\n", "b.py": "\n"})
    found = {f.rel: f.skipped for f in iter_files(tmp_path, max_bytes=100)}
    assert found == {".gitignore": None, "a.log": "ignored", "z": None, "b.py": None}


def test_fifos_and_symlinks_are_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "real.py").write_text("x = 1\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "real.py")
    assert [f.rel for f in iter_files(tmp_path, max_bytes=100)] == ["real.py"]
    with pytest.raises(NotRegularFileError, match="FIFO"):
        read_regular_file(tmp_path / "pipe", 100)  # returns at once: no reader blocks
    with pytest.raises(NotRegularFileError, match="symbolic link"):
        read_regular_file(tmp_path / "link.py", 100)


def test_reads_stop_one_byte_past_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_bytes(b"a" * 1000)
    assert read_regular_file(path, 1000) == b"a" * 1000
    with pytest.raises(FileTooLargeError):
        read_regular_file(path, 999)
    # a character device that never ends: the read stops after max_bytes + 1 bytes
    with pytest.raises(NotRegularFileError, match="device"):
        read_regular_file("/dev/zero", 10)


def test_binary_check() -> None:
    assert text_of("héllo\n".encode()) == "héllo\n"
    assert text_of(b"a\x00b") is None
    assert text_of(b"\xff\xfe") is None


def test_one_language_table_for_edits_and_documents() -> None:
    assert language_for("a/b/C.PY") == "python"
    assert language_for("x.tsx") == "tsx"
    assert language_for("notes.md") == "markdown"
    assert language_for("Makefile") is None
    assert language_for(None) is None
