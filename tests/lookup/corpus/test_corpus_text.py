"""Pure helpers: mention candidates, document names, code-block extraction, capture items."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lookup.corpus.capture import MAX_FENCE, CaptureLimits, capture_items, code_blocks
from lookup.corpus.mentions import document_names, mention_candidates


def test_document_names_include_file_basenames() -> None:
    assert document_names("src/pkg/utils.py", None) == ("src/pkg/utils.py", "utils.py")
    assert document_names("spec", "docs/spec.md") == ("spec", "docs/spec.md", "spec.md")
    assert document_names("Makefile", "build/Makefile") == ("Makefile", "build/Makefile")


def test_mention_candidates_strip_punctuation_and_prefer_paths() -> None:
    got = mention_candidates('Edit "src/app.py", then run it (see README.md). Thanks!')
    assert got == [
        "src/app.py",
        "app.py",
        "README.md",
        "Edit",
        "then",
        "run",
        "it",
        "see",
        "Thanks!",
        "Thanks",
    ]


def test_mention_candidates_are_bounded() -> None:
    prompt = " ".join(f"f{i}.py" for i in range(2000))
    assert len(mention_candidates(prompt, limit=100)) == 100


def test_code_blocks_with_and_without_language() -> None:
    text = "a\n```python\nx = 1\n```\nb\n~~~\nplain\n~~~\n````js title\nlet y\n````\n"
    assert code_blocks(text) == [("python", "x = 1\n"), (None, "plain\n"), ("js", "let y\n")]
    assert code_blocks("```python\nunterminated\n") == []


def test_capture_items_take_answers_then_code_within_limits() -> None:
    limits = CaptureLimits(max_items=3, min_bytes=3, max_bytes=20)
    items = capture_items(
        ["answer one", "x" * 21], ["```c\nint a;\n```\n```\nab\n```\n```go\nvar b int\n```"], limits
    )
    assert [(i.id.split(":")[0], i.text, i.language, i.answer) for i in items] == [
        ("answer", "answer one", None, True),
        ("code", "int a;\n", "c", False),
        ("code", "ab\n", None, False),
    ]
    assert capture_items(["answer one"], [], limits)[0].id == items[0].id  # content-derived


def _scan_cpu_s(text: str) -> float:
    """Best thread CPU time of scanning ``text`` for code blocks (not wall time: CPU time
    is what a scan costs, and a busy machine does not inflate it)."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        code_blocks(text)
        best = min(best, time.thread_time() - start)
    return best


@pytest.mark.parametrize(
    "line",
    [
        lambda i: "```a\n",  # every line opens a block that never closes
        lambda i: "`" * (3 + i % 30) + "\n",  # every line a fence of its own length
    ],
)
def test_code_block_scan_grows_linearly(line: Callable[[int], str]) -> None:
    # a backtracking regex rescans the rest of the text from every line (0.19 s for 10 KB,
    # 3.2 s for 40 KB: 16x for 4x the text)
    small = "".join(line(i) for i in range(2000))
    large = "".join(line(i) for i in range(8000))
    assert len(code_blocks(large)) <= 16
    ratio = _scan_cpu_s(large) / max(_scan_cpu_s(small), 1e-6)
    assert ratio < 8, f"4x the text cost {ratio:.1f}x the CPU time: not linear"


def test_capture_scans_only_the_first_max_scan_chars() -> None:
    limits = CaptureLimits(min_bytes=1, max_scan_chars=100)
    early = "```c\nint early;\n```\n"
    late = "x" * 100 + "\n```c\nint late;\n```\n"
    items = capture_items([], [early + late], limits)
    assert [i.text for i in items] == ["int early;\n"]


def test_code_blocks_look_at_max_fences_openers_at_most() -> None:
    blocks = "".join(f"```\nblock {i}\n```\n" for i in range(5))
    assert len(code_blocks(blocks)) == 5
    assert [body for _, body in code_blocks(blocks, max_fences=2)] == ["block 0\n", "block 1\n"]
    # unclosed openers count too: a prompt that starts with many hides its later blocks
    assert code_blocks("~~~a\n" * 3 + blocks, max_fences=3) == []
    assert len(code_blocks("~~~a\n" * 3 + blocks, max_fences=4)) == 1


def test_fences_longer_than_max_fence_open_no_block() -> None:
    long = "`" * (MAX_FENCE + 1)
    assert code_blocks(f"{long}\nx\n{long}\n") == []
    fence = "`" * MAX_FENCE
    assert code_blocks(f"{fence}\nx\n{fence}\n") == [(None, "x\n")]
