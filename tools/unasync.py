"""Generate the SDK's synchronous client from its asynchronous one (as httpcore does).

    python tools/unasync.py           # rewrites sdk/client.py from sdk/async_client.py
    python tools/unasync.py --check   # exits 1 when sdk/client.py is stale

``sdk/async_client.py`` is the one place a client method is written; ``sdk/client.py`` is
its output, committed so that readers and type checkers see it. The rewrite is textual:
``async``/``await`` go, the async names become their sync twins
(``httpx.AsyncClient`` -> ``httpx.Client``, ``AsyncStream`` -> ``Stream``, ...), and
``await asyncio.to_thread(f, ...)`` becomes ``f(...)``. The result is run through
``ruff format``. ``tests/sdk/test_sdk_unasync.py`` fails when the committed file is stale.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "sdk" / "async_client.py"
TARGET = ROOT / "sdk" / "client.py"

HEADER = "# Generated from sdk/async_client.py by tools/unasync.py; edit that file, not this one.\n"

# (pattern, replacement), applied in order
RULES: list[tuple[str, str]] = [
    (r'^"""The asynchronous client:[^\n]*"""', '"""The synchronous client: every method of the asynchronous one, blocking."""'),
    (r"^import asyncio\n", ""),
    (r"await asyncio\.to_thread\(\s*([\w.]+),\s*", r"\1("),
    (r"\bAn asyncio client\b", "A client"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncStream\b", "Stream"),
    (r"\bAsyncDocuments\b", "Documents"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncRetrying\b", "Retrying"),
    (r"\bAsyncClient\b", "Client"),
    (r"\basync (def|for|with)\b", r"\1"),
    (r"\bawait ", ""),
    (r"\.aread\(\)", ".read()"),
    (r"\baclose\b", "close"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
]  # fmt: skip


def unasync(source: str) -> str:
    """The synchronous twin of the asynchronous client's source, formatted."""
    text = source
    for pattern, replacement in RULES:
        text = re.sub(pattern, replacement, text, flags=re.M)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(TARGET), "-"],
        input=HEADER + text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    generated = unasync(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        stale = TARGET.read_text(encoding="utf-8") != generated
        print(f"{TARGET} is stale: run python tools/unasync.py" if stale else "up to date")
        raise SystemExit(1 if stale else 0)
    TARGET.write_text(generated, encoding="utf-8")
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
