"""A project's files as text: the ``.gitignore`` walk, secret files, the binary check.

The one place these rules live: ``client.documents.put_dir``, ``edit_file`` and the
gateway's ``draftgate index`` all read files through here.

- ``.gitignore`` files (the root's and every subdirectory's) are matched with
  ``pathspec``'s git semantics; the deepest file with a matching rule decides, and
  nothing inside an ignored directory is visited. A line that does not compile (``[z-a]``)
  is passed over, as git passes over what it cannot use. ``.git`` and symbolic links are
  never followed. Not read: ``.git/info/exclude`` and the global excludes file.
- Files that usually hold credentials (``.env``, ``.env.*``, ``*.pem``, ``id_rsa*``, ...,
  see ``SECRET_PATTERNS``) are skipped unless the caller asks for them.
- A file is text when its first 8 KiB hold no NUL byte and all of it is UTF-8.
- Only regular files are read (never a FIFO, device or symlink), at most ``max_bytes + 1``
  bytes of them, so a file that grows or never ends cannot exhaust memory.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pathspec

from sdk.errors import FileTooLargeError, NotRegularFileError

SNIFF_BYTES = 8192
"""How much of a file the NUL-byte test looks at."""

SECRET_PATTERNS = (
    ".env",
    ".env.*",
    "*.env",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.keystore",
    "*.jks",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    "credentials.json",
    "secrets.json",
    "secrets.yaml",
    "secrets.yml",
)
"""File names skipped as likely secrets unless asked for (``.gitignore`` pattern syntax)."""

_SECRETS = pathspec.GitIgnoreSpec.from_lines(SECRET_PATTERNS)

Skip = Literal["ignored", "secret", "binary", "too_large", "unreadable"]


@dataclass(frozen=True)
class FoundFile:
    """A file under the walked root: its text, or why it was skipped."""

    rel: str  # posix path relative to the root
    path: Path
    text: str | None
    skipped: Skip | None = None


def is_secret(name: str) -> bool:
    """Whether a file name looks like one that holds credentials (``SECRET_PATTERNS``)."""
    return _SECRETS.match_file(posixpath.basename(name))


def text_of(data: bytes) -> str | None:
    """The UTF-8 text of a file's bytes, or None when they look binary (a NUL byte or not UTF-8)."""
    if b"\x00" in data[:SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_regular_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``.

    Opens without following a symbolic link and without blocking on a FIFO, checks the
    opened file is regular, and reads at most ``max_bytes + 1`` bytes. Raises
    :class:`NotRegularFileError`, :class:`FileTooLargeError` or ``OSError``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise NotRegularFileError(f"{path}: is a symbolic link; edit the file it points to")
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if stat.S_ISLNK(os.lstat(path).st_mode):  # swapped for a link since the check
            raise NotRegularFileError(f"{path}: is a symbolic link") from exc
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(f"{path}: not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise FileTooLargeError(
                f"{path}: {info.st_size} bytes is over the {max_bytes}-byte cap (max_bytes)"
            )
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise FileTooLargeError(f"{path}: grew past the {max_bytes}-byte cap (max_bytes)")
    return data


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a plain file"


def read_text_file(path: Path, max_bytes: int) -> tuple[str | None, Skip | None]:
    """(text, None), or (None, why not): too large, binary, or unreadable (not regular too)."""
    try:
        data = read_regular_file(path, max_bytes)
    except FileTooLargeError:
        return None, "too_large"
    except (OSError, NotRegularFileError):
        return None, "unreadable"
    text = text_of(data)
    return (text, None) if text is not None else (None, "binary")


def ignore_spec(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    """The rules of a ``.gitignore`` file's lines; lines that do not compile are passed over."""
    lines = list(lines)
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (re.error, ValueError):
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if _compiles(line)])


def _compiles(line: str) -> bool:
    try:
        pathspec.GitIgnoreSpec.from_lines([line])
    except (re.error, ValueError):
        return False
    return True


def _load_spec(directory: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        text = (directory / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return ignore_spec(text.splitlines())


def _is_ignored(specs: list[tuple[str, pathspec.GitIgnoreSpec]], rel: str, is_dir: bool) -> bool:
    """The deepest ``.gitignore`` with a matching rule decides (as in git)."""
    ignored = False
    for base, spec in specs:
        sub = rel[len(base) :] + ("/" if is_dir else "")
        result = spec.check_file(sub)
        if result.include is not None:
            ignored = bool(result.include)
    return ignored


def iter_files(
    root: str | os.PathLike[str], *, max_bytes: int, include_secrets: bool = False
) -> Iterator[FoundFile]:
    """Every regular file under ``root`` in sorted order, with its text or why it was skipped.

    Paths a ``.gitignore`` matches come back once as ``ignored`` (an ignored directory
    once, without its contents); secret-looking files as ``secret`` unless
    ``include_secrets``. ``.git`` and symbolic links are left out silently.
    """
    root = Path(root).resolve()
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
            elif not include_secrets and is_secret(name):
                yield FoundFile(rel, path, None, "secret")
            else:
                yield FoundFile(rel, path, *read_text_file(path, max_bytes))
