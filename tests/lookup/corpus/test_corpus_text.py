"""Pure helpers: mention candidates, document names, code-block extraction, capture items."""

from __future__ import annotations

from lookup.corpus.capture import CaptureLimits, capture_items, code_blocks
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
