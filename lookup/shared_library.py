"""Building a C++ source into a shared library at first use, cached per machine: the one
build step of the project's compiled parts (the drafter's tree builder, the engine's step
kernels).

A library is code this process will run, so the cache is trusted only where nobody else
could have written it: its directory and the file must belong to the current user and be
writable by nobody else, and every directory above it must belong to the user or root and
be writable by nobody else unless sticky (so nobody else can swap a directory on the way).
Otherwise (a shared or planted cache) the library is built in a private directory of this
process instead. ``load`` opens the file without following a symlink, checks the open
descriptor (not the path, which could change after the check) and loads through it."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CACHE_ENV = "DRAFTGATE_KERNEL_CACHE"  # build directory root (default ~/.cache/draftgate)

log = logging.getLogger(__name__)


@functools.cache
def _process_dir() -> Path:
    """A directory only this process's user may use (mode 0700), for untrusted caches."""
    return Path(tempfile.mkdtemp(prefix="draftgate-kernels-"))


def _private(path: Path, kind: int) -> bool:
    """Whether ``path`` is a ``kind`` (S_IFDIR, S_IFREG; a symlink is neither) of the
    current user that no one else may write."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_IFMT(info.st_mode) == kind and _owned_safely(info)


def _owned_safely(info: os.stat_result) -> bool:
    """Whether a file or directory with ``info`` belongs to the current user, none other
    may write it."""
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _safe_ancestors(directory: Path) -> bool:
    """Whether every directory above ``directory`` (resolved) belongs to the current user
    or root and is writable by nobody else, or is sticky (others may not rename what is ours)."""
    real = Path(os.path.realpath(directory))
    for parent in real.parents:
        try:
            info = os.stat(parent)
        except OSError:
            return False
        shared = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if info.st_uid not in (os.getuid(), 0) or (shared and not info.st_mode & stat.S_ISVTX):
            return False
    return True


def load(path: Path, loader: Callable[[str], T]) -> T:
    """``loader`` (``ctypes.CDLL``, ``ctypes.PyDLL``) on the library at ``path``, opened
    without following a symlink and checked on its descriptor: a regular file of the current
    user that no one else may write, in a directory checked as ``build`` checks the cache.
    Loaded through ``/proc/self/fd`` where there is one, so the file checked is the file
    loaded. ``OSError`` when a check fails or the load does.

    The descriptor stays open while the process runs: the dynamic loader matches libraries
    by name, so its ``/proc/self/fd`` name must never come to name another file."""
    if not (_private(path.parent, stat.S_IFDIR) and _safe_ancestors(path.parent)):
        raise OSError(f"{path.parent} is not private to this user")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not (stat.S_ISREG(info.st_mode) and _owned_safely(info)):
            raise OSError(f"{path} is not a file private to this user")
        fd_path = f"/proc/self/fd/{fd}"
        return loader(fd_path if os.path.exists(fd_path) else str(path))
    except BaseException:
        os.close(fd)
        raise


def build(
    source: Path, cflags: Sequence[str], machine: Sequence[str], parts: Sequence[Path] = ()
) -> tuple[Path | None, str]:
    """(the library built from ``source``, "") or (None, why it could not be built).

    One file per source, ``parts`` (the files it includes), compiler, flags and ``machine``
    (what else the build depends on, e.g. the CPU's feature set under -march=native); built
    once, written atomically so that concurrent builders never load a partial file."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or ""
    if not compiler:
        return None, "no C++ compiler (g++ or $CXX)"
    digest = hashlib.sha256(source.read_bytes())
    for part in parts:
        text = part.read_bytes()
        digest.update(f"{part.name} {len(text)}\n".encode() + text)
    digest.update(" ".join([compiler, *cflags, *machine]).encode())
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "draftgate")
    name = f"{source.stem}-{digest.hexdigest()[:16]}.so"
    cache = root / "kernels"
    with contextlib.suppress(OSError):
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (_private(cache, stat.S_IFDIR) and _safe_ancestors(cache)):
        log.warning("kernel cache %s is not private to this user: building privately", cache)
        cache = _process_dir()
    target = cache / name
    if target.exists() or target.is_symlink():
        if _private(target, stat.S_IFREG):
            return target, ""
        log.warning("cached library %s is not private to this user: building privately", target)
        target = _process_dir() / name
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            run = subprocess.run(
                [compiler, *cflags, "-shared", str(source), "-o", str(built)],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                return None, f"build failed: {run.stderr.strip().splitlines()[-1:]}"
            built.chmod(0o755)  # whatever the umask: writable by its owner only
            built.replace(target)
    except OSError as exc:
        return None, f"build failed: {exc}"
    return target, ""
