"""The kernel cache is trusted only where nobody else could have written it: a shared
directory (or one under a directory others may write), another user's file, a writable file
or a symlink is passed over for a private build, and the file loaded is the file checked; a
library that fails to load leaves the torch kernels in charge."""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
from pathlib import Path

import pytest

from local_verifier.devices import cpu_flags
from local_verifier.kernels.cpp import CFLAGS, build_library
from lookup.shared_library import CACHE_ENV, build, load

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")

FLAGS = ["-O1", "-fPIC"]


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "unit.cpp"
    path.write_text('extern "C" int value() { return 7; }\n')
    return path


def test_a_private_cache_is_used(source: Path, tmp_path: Path) -> None:
    first, why = build(source, FLAGS, [])
    assert first is not None and first.parent == tmp_path / "cache" / "kernels", why
    assert oct(first.stat().st_mode & 0o777) == oct(0o755)
    assert build(source, FLAGS, [])[0] == first


def test_a_directory_others_may_write_is_not_trusted(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache" / "kernels"
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        path, why = build(source, FLAGS, [])
    assert path is not None, why
    assert cache not in path.parents and "not private" in caplog.text
    assert not any(cache.iterdir())


@pytest.mark.parametrize("plant", ["writable", "symlink", "other-user"])
def test_a_planted_library_is_not_loaded(source: Path, tmp_path: Path, plant: str) -> None:
    genuine, why = build(source, FLAGS, [])
    assert genuine is not None, why
    planted = tmp_path / "planted.so"
    planted.write_bytes(b"not what the source builds")
    genuine.unlink()
    if plant == "writable":
        shutil.copy(planted, genuine)
        genuine.chmod(0o666)
    elif plant == "symlink":
        genuine.symlink_to(planted)
    else:
        if os.getuid() != 0:
            pytest.skip("giving a file to another user needs root")
        shutil.copy(planted, genuine)
        genuine.chmod(0o644)
        os.chown(genuine, 65534, 65534)
    rebuilt, why = build(source, FLAGS, [])
    assert rebuilt is not None and rebuilt != genuine, why
    assert b"value" in rebuilt.read_bytes()  # built from the source, not the planted bytes


def test_a_library_that_fails_to_load_falls_back(source: Path) -> None:
    path, why = build(source, CFLAGS, sorted(cpu_flags()))  # where build_library looks
    assert path is not None, why
    path.write_bytes(b"\x7fELF damaged")  # still private: only the load can tell
    library, reason = build_library(source)
    assert library is None and "failed to load" in reason


def _planted_library(tmp_path: Path) -> Path:
    """A real library whose ``value`` is not the source's."""
    other = tmp_path / "other" / "unit.cpp"
    other.parent.mkdir()
    other.write_text('extern "C" int value() { return 666; }\n')
    path, why = build(other, FLAGS, ["planted"])
    assert path is not None, why
    return path


def test_the_file_checked_is_the_file_loaded(source: Path, tmp_path: Path) -> None:
    """The library is loaded through the descriptor that was checked: swapping another
    file in at the path between the check and the load changes nothing."""
    genuine, why = build(source, FLAGS, [])
    assert genuine is not None, why
    planted = _planted_library(tmp_path)

    def swap_then_load(name: str) -> ctypes.CDLL:
        os.replace(planted, genuine)  # what a racing attacker would do
        return ctypes.CDLL(name)

    library = load(genuine, swap_then_load)
    assert library.value() == 7
    assert ctypes.CDLL(str(genuine)).value() == 666  # the path now names the planted file


@pytest.mark.parametrize("plant", ["symlink", "writable"])
def test_load_refuses_what_it_cannot_trust(source: Path, tmp_path: Path, plant: str) -> None:
    genuine, why = build(source, FLAGS, [])
    assert genuine is not None, why
    planted = _planted_library(tmp_path)
    genuine.unlink()
    if plant == "symlink":
        genuine.symlink_to(planted)
    else:
        shutil.copy(planted, genuine)
        genuine.chmod(0o666)
    with pytest.raises(OSError):
        load(genuine, ctypes.CDLL)


def test_a_cache_under_a_directory_others_may_write_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever may write a directory above the cache could swap the cache for their own."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky
    monkeypatch.setenv(CACHE_ENV, str(shared / "mine"))
    source = tmp_path / "unit.cpp"
    source.write_text('extern "C" int value() { return 7; }\n')
    with caplog.at_level(logging.WARNING):
        path, why = build(source, FLAGS, [])
    assert path is not None and shared not in path.parents, why
    assert "not private" in caplog.text
    assert load(path, ctypes.CDLL).value() == 7
    cached = shared / "mine" / "kernels" / path.name
    shutil.copy(path, cached)
    with pytest.raises(OSError, match="not private"):
        load(cached, ctypes.CDLL)
