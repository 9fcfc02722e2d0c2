"""The SDK's .gitignore walk (``sdk.files.iter_files``), checked against git itself and pathspec."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pathspec

from sdk.files import iter_files

FILES = [
    "README.md",
    "main.py",
    "main.pyc",
    "debug.log",
    "logs/today.log",
    "logs/keep.log",
    "build/out.txt",
    "src/build/gen.py",
    "src/app.py",
    "src/app_test.py",
    "src/util/helpers.py",
    "src/util/cache/blob.bin.txt",
    "docs/a/b/notes.md",
    "docs/index.md",
    "#hash.txt",
    "!bang.txt",
    "space .txt",
    "tmp1.txt",
    "tmpA.txt",
    "node_modules/pkg/index.js",
    "a/node_modules/x.js",
    "vendor/lib.go",
]

ROOT_IGNORE = """\
# comment line
*.pyc
*.log
!keep.log
/build/
src/**/cache
docs/**/notes.md
\\#hash.txt
\\!bang.txt
tmp[0-9].txt
node_modules/
vendor/*
"""


def kept(root: Path) -> list[str]:
    return [f.rel for f in iter_files(root, max_bytes=1 << 20) if f.skipped != "ignored"]


def make_tree(root: Path, files: list[str], ignore: str) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / ".gitignore").write_text(ignore)


def git_kept(root: Path) -> set[str]:
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    out = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return {p for p in out.split("\0") if p}


def test_walk_agrees_with_pathspec(tmp_path: Path) -> None:
    make_tree(tmp_path, FILES, ROOT_IGNORE)
    spec = pathspec.GitIgnoreSpec.from_lines(ROOT_IGNORE.splitlines())
    expected = {f for f in [*FILES, ".gitignore"] if not spec.match_file(f)}
    assert set(kept(tmp_path)) == expected
    assert "logs/keep.log" in expected and "src/app.py" in expected
    assert "src/build/gen.py" in expected  # /build/ is anchored to the root


def test_walk_agrees_with_git_including_nested_ignore_files(tmp_path: Path) -> None:
    make_tree(tmp_path, FILES, ROOT_IGNORE)
    (tmp_path / "src" / ".gitignore").write_text("*_test.py\n/util/helpers.py\n")
    (tmp_path / "logs" / ".gitignore").write_text("!today.log\n")
    walked = set(kept(tmp_path))
    assert walked == git_kept(tmp_path)
    assert "logs/today.log" in walked  # re-included by the deeper file
    assert "src/app_test.py" not in walked and "src/util/helpers.py" not in walked


def test_walk_skips_dot_git_and_symlinks(tmp_path: Path) -> None:
    make_tree(tmp_path, ["a.py"], "")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("x")
    (tmp_path / "link.py").symlink_to(tmp_path / "a.py")
    assert kept(tmp_path) == [".gitignore", "a.py"]
