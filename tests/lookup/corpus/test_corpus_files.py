"""Directory walking for `draftgate index`: .gitignore, binaries, size caps, symlinks."""

from __future__ import annotations

import os
from pathlib import Path

from lookup.corpus.files import iter_files


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)


def test_walk_reports_texts_and_skip_reasons(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            ".gitignore": "*.tmp\nnode_modules/\n/only_root.txt\n",
            ".git/config": "[core]\n",
            "keep.py": "x = 1\n",
            "scratch.tmp": "ignored\n",
            "only_root.txt": "ignored at the root\n",
            "pkg/only_root.txt": "anchored rule does not apply here\n",
            "node_modules/lib/index.js": "ignored with its directory\n",
            "pkg/.gitignore": "!important.tmp\n",
            "pkg/important.tmp": "re-included by the deeper .gitignore\n",
            "pkg/blob.bin": b"\x00\x01\x02",
            "pkg/big.txt": "y" * 101,
        },
    )
    os.symlink(tmp_path / "keep.py", tmp_path / "link.py")
    found = {f.rel: (f.skipped, f.text) for f in iter_files(tmp_path, max_bytes=100)}
    assert found == {
        ".gitignore": (None, "*.tmp\nnode_modules/\n/only_root.txt\n"),
        "keep.py": (None, "x = 1\n"),
        "scratch.tmp": ("ignored", None),
        "only_root.txt": ("ignored", None),
        "node_modules": ("ignored", None),
        "pkg/.gitignore": (None, "!important.tmp\n"),
        "pkg/only_root.txt": (None, "anchored rule does not apply here\n"),
        "pkg/important.tmp": (None, "re-included by the deeper .gitignore\n"),
        "pkg/blob.bin": ("binary", None),
        "pkg/big.txt": ("too_large", None),
    }
