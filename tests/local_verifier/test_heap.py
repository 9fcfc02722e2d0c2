"""The C heap's free pages go back to the OS (glibc), and nothing breaks elsewhere."""

from __future__ import annotations

import platform
from pathlib import Path

from local_verifier.heap import release_freed


def _anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_free_pages_between_live_blocks_are_returned() -> None:
    if platform.libc_ver()[0] != "glibc":
        assert release_freed() is False  # nothing to call: nothing done
        return
    blocks = [bytes(2048) for _ in range(32_768)]  # 64 MiB of malloc'd blocks
    kept = blocks[::16]  # one in 16 stays: the heap cannot shrink from its top
    del blocks
    before = _anon_mib()
    assert release_freed()
    assert before - _anon_mib() > 32  # the pages between the kept blocks
    assert all(len(b) == 2048 for b in kept)
