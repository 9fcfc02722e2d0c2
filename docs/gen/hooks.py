"""MkDocs hook: fills the pages' generated parts from the code at build time.

A page asks for a part with a marker line, ``<!-- generated: NAME -->``: ``config`` (the
pydantic models of ``gateway/config.py``), ``cli`` (each command's ``--help``), ``http``
(the gateway's ``/openapi.json``), ``metrics`` (its ``/metrics``), ``contributing`` (``CONTRIBUTING.md``). ``results.md`` is ``benchmarks/RESULTS.md``. The
environment page must name every ``DRAFTGATE_*`` variable the product's code reads.
Nothing here touches the network or needs a GPU."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gen_app import http_reference, metrics_reference
from gen_cli import cli_reference
from gen_config import config_reference
from gen_env import missing_from
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
DOCS_LINK = re.compile(r"\]\(docs/")


def contributing() -> str:
    """``CONTRIBUTING.md`` without its title, its links into ``docs/`` made the site's."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    return DOCS_LINK.sub("](", body).strip()


GENERATORS: dict[str, Callable[[], str]] = {
    "contributing": contributing,
    "config": config_reference,
    "cli": cli_reference,
    "http": http_reference,
    "metrics": metrics_reference,
}
MARKER = re.compile(r"^<!-- generated: ([a-z]+) -->$", re.MULTILINE)
RESULTS_SOURCE = "benchmarks/RESULTS.md"
RESULTS_PAGE = "results.md"
ENVIRONMENT_PAGE = "environment.md"
# a relative Markdown link: it points into the repository, not into the site
REPO_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)\s]+)\)")


def on_files(files: Files, config: Any) -> Files:
    text = (ROOT / RESULTS_SOURCE).read_text(encoding="utf-8")
    files.append(File.generated(config, RESULTS_PAGE, content=text))
    return files


def _generated(match: re.Match[str]) -> str:
    name = match.group(1)
    if name not in GENERATORS:
        raise PluginError(f"unknown generated part {name!r}")
    return GENERATORS[name]()


def _repo_link(match: re.Match[str]) -> str:
    target = posixpath.normpath(posixpath.join(posixpath.dirname(RESULTS_SOURCE), match.group(2)))
    text = match.group(1)
    if text.startswith("`") and text.endswith("`"):  # a file's name: its path instead
        return f"`{target}`"
    return f"{text} (`{target}`)"


def _results(markdown: str) -> str:
    """The results page: repository links as paths, and ``[a][b]`` outside code spans
    escaped (it is a shape such as ``[K/16][16]``, not a cross-reference)."""
    parts = REPO_LINK.sub(_repo_link, markdown).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("][", "]\\[")
    return "`".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    path = page.file.src_uri
    if path == RESULTS_PAGE:
        return _results(markdown)
    if path == ENVIRONMENT_PAGE:
        missing = missing_from(markdown, ROOT)
        if missing:
            raise PluginError(f"{ENVIRONMENT_PAGE} does not describe {', '.join(missing)}")
    return MARKER.sub(_generated, markdown)
