"""Building a C++ source into a shared library at first use, cached per machine: the one
build step of the project's compiled parts (the drafter's tree builder, the engine's step
kernels)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

CACHE_ENV = "DRAFTGATE_KERNEL_CACHE"  # build directory root (default ~/.cache/draftgate)


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
    target = root / "kernels" / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target, ""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            run = subprocess.run(
                [compiler, *cflags, "-shared", str(source), "-o", str(built)],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                return None, f"build failed: {run.stderr.strip().splitlines()[-1:]}"
            built.replace(target)
    except OSError as exc:
        return None, f"build failed: {exc}"
    return target, ""
