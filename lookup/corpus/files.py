"""Walking a directory for text files to index: .gitignore honoured, binaries and big files skipped."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pathspec

SNIFF_BYTES = 8192

Skip = Literal["ignored", "binary", "too_large", "unreadable"]


@dataclass(frozen=True)
class FoundFile:
    """A file under the root: its text, or why it was skipped."""

    rel: str  # posix path relative to the root
    path: Path
    text: str | None
    skipped: Skip | None = None


def _load_spec(directory: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = (directory / ".gitignore").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeError):
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _is_ignored(specs: list[tuple[str, pathspec.GitIgnoreSpec]], rel: str, is_dir: bool) -> bool:
    """The deepest ``.gitignore`` with a matching rule decides (as in git)."""
    ignored = False
    for base, spec in specs:
        sub = rel[len(base) :] + ("/" if is_dir else "")
        result = spec.check_file(sub)
        if result.include is not None:
            ignored = bool(result.include)
    return ignored


def read_text_file(path: Path, max_bytes: int) -> tuple[str | None, Skip | None]:
    """(text, None), or (None, why not): too large, binary (a NUL byte or not UTF-8), unreadable."""
    try:
        if path.stat().st_size > max_bytes:
            return None, "too_large"
        data = path.read_bytes()
    except OSError:
        return None, "unreadable"
    if len(data) > max_bytes:
        return None, "too_large"
    if b"\x00" in data[:SNIFF_BYTES]:
        return None, "binary"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "binary"


def iter_files(root: Path, *, max_bytes: int) -> Iterator[FoundFile]:
    """Every regular file under ``root`` in sorted order, skipping ``.git`` and symlinks.

    Paths matched by a ``.gitignore`` (the root's or a subdirectory's) come back once as
    ``ignored`` (an ignored directory once, without its contents).
    """
    root = root.resolve()
    specs_of: dict[str, list[tuple[str, pathspec.GitIgnoreSpec]]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        directory = Path(dirpath)
        rel_dir = "" if directory == root else directory.relative_to(root).as_posix()
        prefix = rel_dir + "/" if rel_dir else ""
        specs = list(specs_of[posixpath.dirname(rel_dir)]) if rel_dir else []
        own = _load_spec(directory)
        if own is not None:
            specs.append((prefix, own))
        specs_of[rel_dir] = specs
        dirnames.sort()
        for name in list(dirnames):
            rel = prefix + name
            if name == ".git" or (directory / name).is_symlink():
                dirnames.remove(name)
            elif _is_ignored(specs, rel, is_dir=True):
                dirnames.remove(name)
                yield FoundFile(rel, directory / name, None, "ignored")
        for name in sorted(filenames):
            rel, path = prefix + name, directory / name
            if path.is_symlink() or not path.is_file():
                continue
            if _is_ignored(specs, rel, is_dir=False):
                yield FoundFile(rel, path, None, "ignored")
                continue
            text, skipped = read_text_file(path, max_bytes)
            yield FoundFile(rel, path, text, skipped)
