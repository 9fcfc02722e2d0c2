"""The documented table (data with source and date per row) and the verdict rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.records.evidence import make, verdict
from gateway.records.table import documented_for, load_table


def test_every_row_names_its_source_and_the_date_checked() -> None:
    rows = load_table()
    assert len(rows) >= 12
    for row in rows:
        assert row.source_url.startswith(("https://", "this project"))
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", row.checked), row.provider
        assert row.kinds


@pytest.mark.parametrize(
    ("kind", "models", "provider", "accepts"),
    [
        ("openai", ["gpt-4o-mini"], "OpenAI", "yes"),
        ("openai", ["gpt-4.1-nano"], "OpenAI", "yes"),
        ("openai", ["o3-mini"], "OpenAI (other models)", "unknown"),
        ("mistral", ["codestral-latest"], "Mistral", "yes"),
        ("mistral", ["mistral-small"], "Mistral (other models)", "no"),
        ("vllm", ["llama"], "vLLM", "no"),
        ("sglang", ["qwen"], "SGLang", "no"),
        ("local", ["smollm2"], "draftgate local verifier", "yes"),
        ("openai_compatible", ["x"], "OpenAI-compatible (unspecified)", "unknown"),
    ],
)
def test_rows_match_by_kind_and_model_family(
    kind: str, models: list[str], provider: str, accepts: str
) -> None:
    row = documented_for(kind, models)
    assert row is not None
    assert (row.provider, row.accepts_prediction) == (provider, accepts)


def test_a_bad_row_names_its_field(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text(
        '[[row]]\nprovider = "X"\nkinds = ["openai"]\naccepts_prediction = "maybe"\n'
        'source_url = "https://x"\nchecked = "2026-11"\n'
    )
    with pytest.raises(ValidationError, match="accepts_prediction"):
        load_table(bad)


def test_newest_decisive_evidence_decides() -> None:
    old_yes = make("probe", "vllm /metrics", "yes", "counters", observed_at=100.0)
    new_no = make("probe", "vllm /metrics", "no", "no counters", observed_at=200.0)
    newer_unknown = make("probe", "usage fields", "unknown", "no fields", observed_at=300.0)
    assert verdict([old_yes, new_no, newer_unknown]) == ("no", new_no)
    assert verdict([old_yes, newer_unknown]) == ("yes", old_yes)
    assert verdict([newer_unknown]) == ("unknown", None)
    assert verdict([]) == ("unknown", None)
