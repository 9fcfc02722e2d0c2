"""The files an agent's conversation shows, recovered and spelt as its edits write them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from lookup import agent_sources
from lookup.agent_sources import (
    AgentSources,
    conversation_texts,
    forms,
    listings,
    spell,
)

FILE = (
    "import json\n"
    "\n"
    "def quote(text: str) -> str:\n"
    '    """Say "hi" to C:\\\\temp\tand café."""\n'
    "    return json.dumps(text)\n"
)
LINES = FILE.split("\n")[:-1]


def claude_read(text: str, start: int = 1) -> str:
    """A Claude Code ``Read`` result: right-aligned numbers, a tab, the line."""
    lines = text.split("\n")[:-1]
    return "".join(f"{n:6d}\t{line}\n" for n, line in enumerate(lines, start))


def codex_listing(text: str) -> str:
    """``cat -n`` output under Codex's short header."""
    return (
        "Chunk ID: 3f2a\nWall time: 0.0103 seconds\nProcess exited with code 0\n"
        f"Original token count: 61\nOutput:\n{claude_read(text)}"
    )


def test_a_claude_code_read_result_gives_the_file_back() -> None:
    note = "\n<system-reminder>\nWhenever you read a file, ...\n</system-reminder>\n"
    assert listings(claude_read(FILE) + note) == [FILE]


def test_a_cat_n_listing_under_a_header_gives_the_file_back() -> None:
    assert listings(codex_listing(FILE)) == [FILE]


def test_arrow_separated_and_unpadded_numbers_are_listings_too() -> None:
    text = "".join(f"{n}\u2192{line}\n" for n, line in enumerate(LINES, 41))
    assert listings(text) == [FILE]


def test_a_gap_in_the_numbers_splits_listings_and_short_runs_are_not_listings() -> None:
    first, second = "a\nb\nc\n", "x\ny\nz\nw\n"
    text = claude_read(first, 1) + claude_read(second, 10) + "1\tone\n2\ttwo\n"
    assert listings(text) == [first, second]
    assert listings("1. a list\n2. of items\n3. in prose\n") == []


def test_each_form_is_the_text_with_its_prefixes_and_escapes() -> None:
    plain, context, removed, added, *escaped = forms(FILE)
    assert plain == FILE
    for form, prefix in ((context, " "), (removed, "-"), (added, "+")):
        lines = form.split("\n")
        assert lines[-1] == "" and all(line.startswith(prefix) for line in lines[:-1])
        assert "\n".join(line[1:] for line in lines[:-1]) + "\n" == FILE
    for form, raw in zip(escaped, (plain, context, removed, added), strict=True):
        assert json.loads(f'"{form}"') == raw
        assert "\n" not in form and "\t" not in form and "café" in form
    assert forms(FILE, plain=False) == forms(FILE)[1:]


def test_the_forms_are_what_edit_write_and_apply_patch_calls_carry() -> None:
    """The text an edit repeats is a substring of one form, in each tool call's JSON."""
    old, new = "\n".join(LINES[2:5]), "\n".join(LINES[2:4])
    edit = json.dumps(
        {"file_path": "/repo/q.py", "old_string": old, "new_string": new}, ensure_ascii=False
    )
    write = json.dumps({"file_path": "/repo/q.py", "content": FILE}, ensure_ascii=False)
    patch = (
        "*** Begin Patch\n*** Update File: q.py\n@@\n"
        + "".join(f" {line}\n" for line in LINES[:3])
        + "".join(f"-{line}\n" for line in LINES[3:])
        + "".join(f"+{line}\n" for line in LINES[3:4])
        + "*** End Patch\n"
    )
    shell = json.dumps({"cmd": f"apply_patch <<'EOF'\n{patch}EOF\n"}, ensure_ascii=False)
    json_plain, json_context, json_removed, json_added = forms(FILE)[4:]
    old_escaped = json.dumps(old, ensure_ascii=False)[1:-1]
    assert old_escaped in edit and old_escaped in spell(FILE, "", True)
    assert json_plain in write
    context = json.dumps("".join(f" {line}\n" for line in LINES[:3]))[1:-1]
    removed = json.dumps("".join(f"-{line}\n" for line in LINES[3:]), ensure_ascii=False)[1:-1]
    assert context in shell and context in json_context
    assert removed in shell and removed in json_removed
    added = json.dumps(f"+{LINES[3]}\n", ensure_ascii=False)[1:-1]
    assert added in shell and added in json_added
    assert patch.split("@@\n")[1].split("-")[0] in forms(FILE)[1]  # raw: a custom tool's input


def test_conversation_texts_take_listings_anywhere_and_bare_tool_results() -> None:
    bare = "src/a.py\nsrc/b.py\nsrc/c.py"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent.\nUse the tools.\nBe brief."},
        {"role": "user", "content": [{"type": "text", "text": claude_read(FILE)}]},
        {"role": "tool", "content": bare},
        {"role": "tool", "content": "ok"},  # too short to be a file
        {"role": "tool", "content": codex_listing(FILE)},  # the same file again
    ]
    assert conversation_texts(messages) == [(FILE, True), (bare, False)]  # newest first


def test_conversation_texts_keep_the_newest_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old, new = "o\n" * 40, "n\n" * 40
    monkeypatch.setattr(agent_sources, "MAX_TEXT_CHARS", 100)
    messages = [{"role": "tool", "content": claude_read(t)} for t in (old, new)]
    assert conversation_texts(messages) == [(new, True)]


def test_documents_are_every_forms_tokens_and_cached_per_tokenizer() -> None:
    calls: list[str] = []

    def encode(text: str) -> list[int]:
        calls.append(text)
        return [ord(c) for c in text]

    sources = AgentSources(max_tokens=10_000)
    messages = [{"role": "tool", "content": claude_read(FILE)}]
    ((key, tokens),) = sources.documents(messages, encode, "tok-a")
    assert tokens.dtype == np.uint32
    assert tokens.tolist() == [ord(c) for c in "".join(forms(FILE))]
    assert len(calls) == 8
    again = sources.documents(messages, encode, "tok-a")
    assert again == [(key, tokens)] and len(calls) == 8  # cached: not tokenized again
    ((other, _),) = sources.documents(messages, encode, "tok-b")
    assert other != key and len(calls) == 16


def test_the_cache_keeps_at_most_its_bound() -> None:
    sources = AgentSources(max_tokens=3 * len("".join(forms(FILE))))

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    for i in range(5):
        text = FILE.replace("json", f"json{i}")
        sources.documents([{"role": "tool", "content": claude_read(text)}], encode, "t")
    assert 0 < len(sources._entries) <= 3
    assert sources._tokens == sum(len(t) for t in sources._entries.values()) <= sources.max_tokens
