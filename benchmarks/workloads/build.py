"""Regenerate ``default.jsonl``, the benchmark workload this project measures itself with.

    python benchmarks/workloads/build.py            # rewrites benchmarks/workloads/default.jsonl
    python benchmarks/workloads/build.py --check    # exits 1 when the committed file differs

The code edits and documents are cut from CPython 3.11's standard library (the source
of each request is named in its ``source`` field); the prompts and the short texts of
the other categories were written for this project. The output is deterministic for a
given CPython 3.11 build, so run it with CPython 3.11. The committed JSONL is what the
tests and benchmarks read; nothing reads the standard library at test time.

Format (one request per line): ``id``, ``category`` (``code_edit``, ``doc_qa``, ``json``,
``multilingual``, ``chat``, ``repeat``), ``messages`` (OpenAI chat messages),
``prediction`` (the code being edited, in the fenced shape the answer is asked for, or
null), ``documents`` (``[{id, text}]`` to put in the corpus first), ``series`` (requests
of one series run in file order and each answer becomes a document for the next, or
null), ``max_tokens``, ``source`` and ``instruction``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("default.jsonl")
MAX_TOKENS = 256

# (module, qualified name, what the edit asks for)
CODE_EDITS = [
    ("shlex", "quote", "rename the function `quote` to `shell_quote`"),
    ("calendar", "monthrange", "rename the parameter `month` to `month_number`"),
    ("colorsys", "rgb_to_hls", "rename the local variable `sumc` to `channel_sum`"),
    ("statistics", "median", "rename the function `median` to `middle_value`"),
    ("tokenize", "untokenize", "rename the parameter `iterable` to `tokens`"),
    ("operator", "attrgetter", "rename the class `attrgetter` to `AttributeGetter`"),
    ("statistics", "variance", "rename the parameter `xbar` to `mean`"),
    ("ipaddress", "collapse_addresses", "rename the parameter `addresses` to `networks`"),
    (
        "fractions",
        "Fraction.limit_denominator",
        "change the default of `max_denominator` from 1000000 to 10000",
    ),
    ("urllib.parse", "urljoin", "rename the parameter `allow_fragments` to `keep_fragments`"),
    ("shutil", "which", "rename the parameter `path` to `search_path`"),
]

# (module, attribute holding the text, what to copy)
DOCUMENTS = [
    (
        "sched",
        "__doc__",
        "the sentence that says how lower priority numbers are treated",
    ),
    (
        "heapq",
        "__about__",
        "the sentence that says what the interesting property of a heap is",
    ),
    (
        "string",
        "__doc__",
        "the line that describes the constant `punctuation`",
    ),
]

JSON_SERIES = [
    "pathspec | 0.12.1 | MPL-2.0\nhttpx | 0.28.1 | BSD-3-Clause\ntenacity | 9.0.0 | Apache-2.0",
    "redis | 5.2.1 | MIT\nstarlette | 0.41.3 | BSD-3-Clause\nuvicorn | 0.32.1 | BSD-3-Clause",
    "numpy | 2.1.3 | BSD-3-Clause\npydantic | 2.10.3 | MIT\nrich | 13.9.4 | MIT\ntqdm | 4.67.1 | MPL-2.0",
]

REPEAT_SERIES = [
    "Ticket 4121 from Priya: the export button on the billing page does nothing in Firefox; "
    "finance cannot send invoices today.",
    "Ticket 4133, reported by Tom: typo on the login screen, it says 'Pasword'. Not urgent.",
    "Ticket 4140 (Ana): search results load slowly since yesterday's deploy, about eight "
    "seconds per query for every customer.",
    "Ticket 4152 from Lee: the mobile app crashes when a photo larger than 20 MB is attached "
    "to a report.",
]

MULTILINGUAL = [
    ("de", "Der Zug nach Hamburg fährt heute wegen Bauarbeiten eine Stunde später ab."),
    ("ja", "この図書館では、本を三週間まで借りることができます。"),
    ("es", "Si llueve mañana, la reunión del equipo se hará por videollamada."),
]

CHAT = [
    "Why do hash tables need a good hash function? Answer in a short paragraph.",
    "Give three tips for writing clear commit messages.",
    "Describe a quiet morning in a mountain village in about five sentences.",
]


def _stdlib_path(module: str) -> tuple[Any, Path]:
    mod = importlib.import_module(module)
    path = Path(inspect.getsourcefile(mod) or "")
    return mod, path


def _source_name(path: Path) -> str:
    rel = path.relative_to(sysconfig.get_paths()["stdlib"]).as_posix()
    return f"cpython-3.11/Lib/{rel}"


def _fenced(code: str) -> str:
    return f"```python\n{code}```"


def code_edit(n: int, module: str, qualname: str, instruction: str) -> dict[str, Any]:
    mod, path = _stdlib_path(module)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    lines, first = inspect.getsourcelines(obj)
    code = textwrap.dedent("".join(lines))
    prompt = (
        f"Change this Python code: {instruction}. Leave every other line as it is. "
        "Reply with the whole changed code in one ```python block and nothing else.\n\n"
        + _fenced(code)
    )
    return {
        "id": f"edit{n:02d}",
        "category": "code_edit",
        "source": f"{_source_name(path)}:{first}-{first + len(lines) - 1}",
        "instruction": instruction,
        "messages": [{"role": "user", "content": prompt}],
        "prediction": _fenced(code),
        "documents": [],
        "series": None,
        "max_tokens": MAX_TOKENS,
    }


def doc_qa(n: int, module: str, attribute: str, what: str) -> dict[str, Any]:
    mod, path = _stdlib_path(module)
    text = textwrap.dedent(getattr(mod, attribute)).strip() + "\n"
    doc_id = f"{module}-{attribute.strip('_')}.txt"
    instruction = f"Copy, word for word, {what}."
    prompt = f"Read this document.\n\n<document>\n{text}</document>\n\n{instruction}"
    return {
        "id": f"docqa{n:02d}",
        "category": "doc_qa",
        "source": f"{_source_name(path)} ({module}.{attribute})",
        "instruction": instruction,
        "messages": [{"role": "user", "content": prompt}],
        "prediction": None,
        "documents": [{"id": doc_id, "text": text}],
        "series": None,
        "max_tokens": MAX_TOKENS,
    }


def plain(
    rid: str, category: str, instruction: str, *, series: str | None = None, max_tokens: int = 256
) -> dict[str, Any]:
    return {
        "id": rid,
        "category": category,
        "source": None,
        "instruction": instruction,
        "messages": [{"role": "user", "content": instruction}],
        "prediction": None,
        "documents": [],
        "series": series,
        "max_tokens": max_tokens,
    }


def build() -> list[dict[str, Any]]:
    """Every request of the workload, in file order."""
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("run with CPython 3.11: the code edits are cut from its stdlib")
    rows = [code_edit(n, *spec) for n, spec in enumerate(CODE_EDITS)]
    rows += [doc_qa(n, *spec) for n, spec in enumerate(DOCUMENTS)]
    for n, table in enumerate(JSON_SERIES):
        ask = (
            'Turn this table into a JSON array of objects with the keys "package", '
            f'"version" and "license". Answer with the JSON only.\n\n{table}'
        )
        rows.append(plain(f"json{n:02d}", "json", ask, series="json-packages", max_tokens=160))
    for n, (lang, sentence) in enumerate(MULTILINGUAL):
        ask = f"Translate into English: {sentence}"
        rows.append(plain(f"multilingual{n:02d}-{lang}", "multilingual", ask))
    for n, question in enumerate(CHAT):
        rows.append(plain(f"chat{n:02d}", "chat", question))
    for n, ticket in enumerate(REPEAT_SERIES):
        ask = (
            "Summarise this support ticket as three Markdown bullet points named "
            f"Component, Severity and Summary.\n\n{ticket}"
        )
        rows.append(plain(f"repeat{n:02d}", "repeat", ask, series="tickets", max_tokens=160))
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = render(build())
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print("up to date" if same else f"{args.out} differs from what build.py makes")
        raise SystemExit(0 if same else 1)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
