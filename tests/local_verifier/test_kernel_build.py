"""The C++ step kernels' build: one translation unit (``step_cpu.cpp`` and the parts it
includes), cached under a key that covers every part, shipped whole in the package."""

from __future__ import annotations

import ctypes
import fnmatch
import re
import shutil
from pathlib import Path

import pytest
import tomllib

from local_verifier.kernels import step_args
from local_verifier.kernels.cpp import SOURCE, load_library, parts_of
from lookup.shared_library import CACHE_ENV, build

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def _included(source: Path) -> set[Path]:
    """Every file ``source`` includes with quotes, directly or through another."""
    found: set[Path] = set()
    pending = [source]
    while pending:
        current = pending.pop()
        for name in INCLUDE.findall(current.read_text()):
            path = (current.parent / name).resolve()
            assert path.exists(), f"{current.name} includes a missing {name}"
            if path not in found:
                found.add(path)
                pending.append(path)
    return found


def test_the_parts_are_exactly_what_the_source_includes() -> None:
    assert _included(SOURCE) == {p.resolve() for p in parts_of(SOURCE)}


def test_the_package_ships_every_part() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["local_verifier.kernels"]
    package = SOURCE.parent
    for path in (SOURCE, *parts_of(SOURCE)):
        relative = path.relative_to(package).as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), relative


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_a_changed_part_builds_a_new_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    source, part = tmp_path / "unit.cpp", tmp_path / "part.h"
    source.write_text('#include "part.h"\nextern "C" int value() { return kValue; }\n')
    part.write_text("constexpr int kValue = 1;\n")
    first, why = build(source, ["-O1", "-fPIC"], [], [part])
    assert first is not None, why
    assert build(source, ["-O1", "-fPIC"], [], [part])[0] == first  # cached
    part.write_text("constexpr int kValue = 2;\n")
    second, why = build(source, ["-O1", "-fPIC"], [], [part])
    assert second is not None and second != first, why


def test_the_step_args_mirror_matches_the_c_struct() -> None:
    library, why = load_library()
    if library is None:
        pytest.skip(f"no C++ kernels here: {why}")
    expected = step_args.layout()
    out = (ctypes.c_int64 * len(expected))()
    assert library.dg_step_args_layout(out) == len(expected)
    assert list(out) == expected
