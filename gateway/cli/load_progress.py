"""``draftgate serve``'s model loading as it happens: a log line as each local endpoint
starts loading (the endpoint logs when it is loaded, and in how many seconds), and on a
terminal a live line counting the models loaded with the time taken so far."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from rich.console import Console

from gateway.endpoints.local.endpoint import LocalEndpoint
from gateway.progress import progress, stderr_console

POLL_S = 0.2
"""How often the endpoints' load states are read."""
DONE = ("loaded", "failed")

log = logging.getLogger(__name__)


def _watch(endpoints: Mapping[str, LocalEndpoint], console: Console) -> None:
    waiting = dict(endpoints)
    while waiting and all(e.state == "idle" for e in waiting.values()):
        time.sleep(POLL_S)  # the server's start-up queues the loads
    for name, endpoint in waiting.items():  # the server started them all at once
        log.info("local endpoint %s: loading %s", name, endpoint.config.model)
    models = ", ".join(sorted({e.config.model or name for name, e in waiting.items()}))
    with progress(
        f"loading {models}", len(waiting), console=console, enabled=console.is_terminal
    ) as task:
        while waiting:
            for name in [n for n, e in waiting.items() if e.state in DONE]:
                del waiting[name]
                task.advance()
            if waiting:
                time.sleep(POLL_S)


def watch_loads(
    endpoints: Mapping[str, LocalEndpoint], *, console: Console | None = None
) -> threading.Thread | None:
    """Show the loads of ``endpoints`` not yet loaded, from a daemon thread (returned; None
    when every model is loaded already)."""
    pending = {n: e for n, e in endpoints.items() if e.state not in DONE}
    if not pending:
        return None
    thread = threading.Thread(
        target=_watch,
        args=(pending, console or stderr_console()),
        daemon=True,
        name="draftgate-load-progress",
    )
    thread.start()
    return thread
