"""The command-line reference: each command's ``--help``, as the installed CLI prints it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import typer.main
from typer.testing import CliRunner

from gateway.cli import app

WIDTH = 90
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _commands(group: object, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, command in getattr(group, "commands", {}).items():
        yield (*prefix, name)
        yield from _commands(command, (*prefix, name))


def _help(args: tuple[str, ...]) -> str:
    result = CliRunner().invoke(
        app,
        [*args, "--help"],
        env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"},
        terminal_width=WIDTH,
        prog_name="draftgate",
    )
    if result.exit_code != 0:
        raise RuntimeError(f"draftgate {' '.join(args)} --help failed: {result.output}")
    text = ANSI.sub("", result.output)  # in case a terminal setting forced colours anyway
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def cli_reference() -> str:
    """One section per command, its help text verbatim."""
    lines = ["## `draftgate`", "", "```text", _help(()), "```", ""]
    for args in _commands(typer.main.get_command(app), ()):
        lines += [f"## `draftgate {' '.join(args)}`", "", "```text", _help(args), "```", ""]
    return "\n".join(lines)
