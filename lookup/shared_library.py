"""Building a C++ source into a shared library at first use, cached per machine: the one
build step of the project's compiled parts (the drafter's tree builder, the engine's step
kernels).

A library is code this process will run, so the cache is trusted only where nobody else
could have written it: its directory and the file must belong to the current user and be
writable by nobody else. Otherwise (a shared or planted cache) the library is built in a
private directory of this process instead."""

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
from collections.abc import Sequence
from pathlib import Path

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
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return (
        stat.S_IFMT(info.st_mode) == kind and info.st_uid == os.getuid() and not writable_by_others
    )


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
    if not _private(cache, stat.S_IFDIR):
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
