"""Progress of long work: a live rich bar on a terminal, plain lines anywhere else (CI,
pipes, log files). Progress goes to stderr unless given another console, so it never
mixes with a result written to stdout."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

PLAIN_STEPS = 10
"""Plain lines per task with a known total: one as each tenth of it is done."""

T = TypeVar("T")


class Task:
    """One piece of long work being counted; :meth:`advance` after each item."""

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items done."""


class _LiveTask(Task):
    def __init__(self, bar: Progress, task: TaskID) -> None:
        self._bar = bar
        self._task = task

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)


class _PlainTask(Task):
    """A line at the start, one each tenth of the total (each item when no total), and
    one at the end with the seconds taken."""

    def __init__(self, console: Console, description: str, total: int | None) -> None:
        self._console = console
        self._description = description
        self._total = total
        self._done = 0
        self._began = time.perf_counter()
        self._line(self._count())

    def _count(self) -> str:
        return f"{self._done}" if self._total is None else f"{self._done}/{self._total}"

    def _line(self, text: str) -> None:
        file = self._console.file
        file.write(f"{self._description}: {text}\n")
        file.flush()

    def advance(self, n: int = 1) -> None:
        before, self._done = self._done, self._done + n
        if self._total is None or self._total <= 0:
            self._line(self._count())
            return
        step = self._total / PLAIN_STEPS
        if int(self._done / step) > int(before / step) and self._done < self._total:
            self._line(f"{self._count()} ({100 * self._done // self._total}%)")

    def finish(self) -> None:
        self._line(f"{self._count()} in {time.perf_counter() - self._began:.1f} s")


def stderr_console() -> Console:
    """The console progress goes to: stderr, a terminal or not as rich detects it (a tty,
    ``TERM``, ``FORCE_COLOR``/``TTY_COMPATIBLE``)."""
    return Console(stderr=True)


@contextmanager
def progress(
    description: str,
    total: int | None = None,
    *,
    console: Console | None = None,
    enabled: bool = True,
) -> Iterator[Task]:
    """A :class:`Task` counting ``total`` items (None: unknown), shown on ``console``
    (default: stderr) as a live bar on a terminal, else as plain lines; ``enabled=False``
    shows nothing."""
    if not enabled:
        yield Task()
        return
    console = console or stderr_console()
    if not console.is_terminal:
        task = _PlainTask(console, description, total)
        yield task
        task.finish()
        return
    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # stdout's lines are drawn above the bar only when stdout is the screen too: a result
    # stream sent to a pipe or file stays there
    screen = sys.stdout.isatty()
    with Progress(*columns, console=console, redirect_stdout=screen, refresh_per_second=4) as bar:
        yield _LiveTask(bar, bar.add_task(escape(description), total=total))  # text, not markup


def track(
    items: Iterable[T],
    description: str,
    *,
    total: int | None = None,
    console: Console | None = None,
    enabled: bool = True,
) -> Iterator[T]:
    """Each of ``items``, counted in a :func:`progress` task (``total``: default, the
    number of ``items`` where they have one)."""
    if total is None and isinstance(items, Sized):
        total = len(items)
    with progress(description, total, console=console, enabled=enabled) as task:
        for item in items:
            yield item
            task.advance()
