"""A small ``.gitignore`` matcher and a directory walk that honours it.

Covers what git documents for ignore files: comments, blank lines, ``!`` negation (the
last matching rule wins), a trailing ``/`` for directories only, a ``/`` at the start or
in the middle anchoring the pattern to the file's directory, ``*``, ``?``, ``[...]``,
``**`` as leading, trailing or middle segment, backslash escapes, and ``.gitignore``
files in subdirectories (deeper files win). As in git, nothing inside an ignored
directory can be re-included. Not read: ``.git/info/exclude`` and the global excludes file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Rule:
    """One pattern line, compiled."""

    regex: re.Pattern[str]
    negate: bool
    dir_only: bool

    def matches(self, rel_path: str, is_dir: bool) -> bool:
        """Whether ``rel_path`` (posix, relative to the ignore file's directory) matches."""
        return (is_dir or not self.dir_only) and self.regex.fullmatch(rel_path) is not None


def _glob_segment(segment: str) -> str:
    """Regex for one path segment of a glob (``*``/``?`` never cross a ``/``)."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        c = segment[i]
        if c == "\\" and i + 1 < len(segment):
            out.append(re.escape(segment[i + 1]))
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1
            if j < len(segment) and segment[j] in "!^":
                j += 1
            if j < len(segment) and segment[j] == "]":
                j += 1
            j = segment.find("]", j)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = segment[i + 1 : j]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_rule(line: str) -> Rule | None:
    """A compiled rule for one ``.gitignore`` line, or None for a blank line or comment."""
    line = re.sub(r"(?<!\\) +$", "", line.rstrip("\r\n"))
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    segments = line.lstrip("/").split("/")
    parts: list[str] = []
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:.*/)?")
        else:
            parts.append(_glob_segment(segment) + ("" if last else "/"))
    prefix = "" if anchored else "(?:.*/)?"
    return Rule(re.compile(prefix + "".join(parts), re.S), negate, dir_only)


def parse_rules(lines: Sequence[str]) -> list[Rule]:
    """The rules of a ``.gitignore`` file's lines, in order."""
    return [rule for line in lines if (rule := parse_rule(line)) is not None]


_RuleSet = tuple[str, list[Rule]]  # (directory relative to the walk root, "" = root; rules)


def _ignored(rel_path: str, is_dir: bool, rule_sets: Sequence[_RuleSet]) -> bool:
    ignored = False
    for base, rules in rule_sets:
        sub = rel_path[len(base) + 1 :] if base else rel_path
        for rule in rules:
            if rule.matches(sub, is_dir):
                ignored = not rule.negate
    return ignored


def walk_files(root: str | os.PathLike[str]) -> Iterator[tuple[str, Path]]:
    """``(posix path relative to root, path)`` of each file not ignored, in sorted order.

    Skips ``.git`` and symbolic links.
    """
    yield from _walk(Path(root), "", [])


def _walk(directory: Path, rel_dir: str, rule_sets: list[_RuleSet]) -> Iterator[tuple[str, Path]]:
    ignore_file = directory / ".gitignore"
    if ignore_file.is_file():
        lines = ignore_file.read_text(encoding="utf-8", errors="replace").splitlines()
        rule_sets = [*rule_sets, (rel_dir, parse_rules(lines))]
    with os.scandir(directory) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if entry.name == ".git" or entry.is_symlink():
            continue
        rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
        is_dir = entry.is_dir()
        if _ignored(rel, is_dir, rule_sets):
            continue
        if is_dir:
            yield from _walk(Path(entry.path), rel, rule_sets)
        elif entry.is_file():
            yield rel, Path(entry.path)
