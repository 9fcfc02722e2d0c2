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

from local_verifier.devices import cpu_flags
from local_verifier.kernels import step_args
from local_verifier.kernels.cpp import CFLAGS, SOURCE, build_library, load_library, parts_of
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
    if load_library()[0] is None:
        pytest.skip(f"no C++ kernels here: {load_library()[1]}")
    path, why = build(SOURCE, CFLAGS, sorted(cpu_flags()), parts_of(SOURCE))
    assert path is not None, why
    library = ctypes.CDLL(str(path))  # untyped and unchecked: the layout as the C side has it
    expected = step_args.layout()
    out = (ctypes.c_int64 * len(expected))()
    assert library.dg_step_args_layout(out) == len(expected)
    assert list(out) == expected


def test_a_library_whose_struct_differs_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    if load_library()[0] is None:
        pytest.skip(f"no C++ kernels here: {load_library()[1]}")
    wrong = step_args.layout()
    wrong[-1] += 4  # the last field one int wider
    monkeypatch.setattr(step_args, "layout", lambda: wrong)
    library, why = build_library(SOURCE)
    assert library is None and "DgStepArgs" in why


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_a_source_from_before_the_struct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    source = tmp_path / "old.cpp"
    source.write_text('extern "C" int dg_bf16_kernels() { return 0; }\n')
    library, why = build_library(source)
    assert library is None and "DgStepArgs" in why
