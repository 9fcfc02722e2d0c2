"""Output quality checks: faster wrong output is no gain."""

from __future__ import annotations

import ast
import json
import re

from gateway.audit.workload import WorkloadItem

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
JSON_CATEGORIES = {"json", "repeat"}

Checks = dict[str, bool | None]


def _strip_fence(text: str) -> str:
    m = _FENCE.search(text)
    return m.group(2) if m else text.strip()


def _parses_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _parses_python(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def check(item: WorkloadItem, text: str) -> Checks:
    """Each check is True (passed), False (failed) or None (does not apply).

    - ``code_blocks_complete``: every opened ``` fence is closed (code_edit must have one);
    - ``python_parses``: each ```python block parses with ``ast``;
    - ``json_blocks_parse``: each ```json block parses with ``json``;
    - ``json_valid``: for json/repeat prompts the answer (fence stripped) is valid JSON;
    - ``stop_honoured``: no stop sequence appears in the output.
    """
    fences = text.count("```")
    blocks = _FENCE.findall(text)
    complete: bool | None = fences % 2 == 0 if fences else None
    if item.category == "code_edit":
        complete = bool(fences) and fences % 2 == 0
    python = [body for lang, body in blocks if lang.lower() in ("python", "py")]
    json_blocks = [body for lang, body in blocks if lang.lower() == "json"]
    return {
        "code_blocks_complete": complete,
        "python_parses": all(_parses_python(b) for b in python) if python else None,
        "json_blocks_parse": all(_parses_json(b) for b in json_blocks) if json_blocks else None,
        "json_valid": _parses_json(_strip_fence(text))
        if item.category in JSON_CATEGORIES
        else None,
        "stop_honoured": all(s not in text for s in item.stop) if item.stop else None,
    }
