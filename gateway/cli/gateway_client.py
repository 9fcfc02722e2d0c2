"""What the ``endpoints`` and ``audit`` commands share: their options, and reaching a
gateway over HTTP: ``--base-url`` of a running one, or the gateway built from the
configuration and served on a free loopback port in a background thread (so TTFT is
measured over real streaming HTTP)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

CONFIG = typer.Option(
    None, "--config", help="draftgate.toml (default: ./draftgate.toml or built-in)."
)
BASE_URL = typer.Option(
    None, "--base-url", help="A running gateway (default: start one in-process)."
)
API_KEY = typer.Option(None, "--api-key", envvar="DRAFTGATE_API_KEY", help="Gateway API key.")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``message`` as an error; the exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def settings_of(config: Path | None) -> Any:
    """The settings of ``config``; a bad file ends the command with its message."""
    from gateway.config import ConfigError, load_settings

    try:
        return load_settings(config)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def auth_headers(settings: Any, api_key: str | None) -> dict[str, str]:
    """The caller's key, else (in-process gateway) the first configured admin key (audits
    and probes need one), else the first key."""
    key = api_key
    if key is None and settings is not None and settings.keys:
        entry = next((k for k in settings.keys if k.admin), settings.keys[0])
        key = os.environ.get(entry.key_env)
    return {"authorization": f"Bearer {key}"} if key else {}


@contextlib.contextmanager
def gateway_url(settings: Any, base_url: str | None) -> Iterator[str]:
    """The gateway's root URL: ``base_url``, or an in-process gateway served meanwhile."""
    if base_url:
        yield base_url.rstrip("/")
        return
    from gateway.app import create_app
    from gateway.audit.serve import serve_in_thread

    with serve_in_thread(create_app(settings)) as url:
        yield url


def get_records(url: str, headers: dict[str, str], probe: bool) -> list[dict[str, Any]]:
    import httpx

    method, path = ("POST", "/v1/endpoints/probe") if probe else ("GET", "/v1/endpoints")
    try:
        body: dict[str, object] | None = (
            {} if probe else None
        )  # POSTs carry a JSON body (the gateway refuses others)
        resp = httpx.request(method, f"{url}{path}", headers=headers, json=body, timeout=300)
    except httpx.HTTPError as exc:
        raise fail(f"gateway unreachable at {url}: {type(exc).__name__}", 1) from None
    if resp.status_code != 200:
        raise fail(f"{method} {path} answered {resp.status_code}: {resp.text[:300]}", 1)
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


def ms(v: float | None) -> str:
    """Seconds as whole milliseconds (``-`` for none)."""
    return "-" if v is None else f"{v * 1e3:.0f}"
