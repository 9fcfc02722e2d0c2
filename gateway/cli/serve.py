"""``draftgate serve`` (the gateway) and ``draftgate verifier`` (one local model behind
the same OpenAI-compatible API, no auth)."""

from __future__ import annotations

import copy
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

import typer

from gateway.config import ConfigError, ServerConfig, Settings, build_settings, load_settings

OWN_PACKAGES = ("gateway", "local_verifier", "lookup", "sdk")
"""The packages whose loggers ``draftgate serve`` and ``draftgate verifier`` print."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` only reaches this machine (``localhost`` and loopback addresses)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(
                ipaddress.ip_address(info[4][0]).is_loopback
                for info in socket.getaddrinfo(host, None)
            )
        except OSError:
            return False


def check_bind(settings: Settings, host: str, allow_public: bool) -> None:
    """Refuse a non-loopback bind when no gateway keys are configured."""
    if is_loopback(host) or allow_public or settings.allow_public_bind:
        return
    if not settings.auth or not settings.keys:
        raise ConfigError(
            f"refusing to bind {host}: no gateway keys are configured, so anyone who can reach "
            "it could use the upstreams' credentials. Configure [[keys]] or pass --allow-public."
        )


def verifier_settings(
    model: str,
    device: str | None = None,
    dtype: str | None = None,
    max_batch: int | None = None,
) -> Settings:
    """One local endpoint on ``model`` (served under its own name), no auth."""
    name = Path(model).name if ("/" in model or model.endswith(".gguf")) else model
    endpoint: dict[str, Any] = {"name": "local", "kind": "local", "model": model, "models": [name]}
    if device:
        endpoint["device"] = device
    if dtype:
        endpoint["dtype"] = dtype
    if max_batch is not None:
        endpoint["max_batch"] = max_batch
    return build_settings({"endpoints": [endpoint], "auth": False}, "verifier")


def run_server(
    app: Any,
    host: str,
    port: int,
    *,
    server: ServerConfig | None = None,
    access_log: bool = False,
    log_level: str = "info",
) -> None:
    """Serve ``app`` with uvicorn as ``draftgate serve`` does (httptools and uvloop when
    installed), bounded by ``server``: connections at once, keep-alive, and a deadline on
    each request's headers. The access log is off by default: ``/metrics`` and the records
    already count every request, and a log line per request costs more than the gateway's
    own work."""
    import uvicorn

    from gateway.http.protocol import header_deadline_protocol

    server = server or ServerConfig()
    uvicorn.run(
        app,
        host=host,
        port=port,
        http=header_deadline_protocol(server.header_timeout_s),
        limit_concurrency=server.limit_concurrency,
        timeout_keep_alive=server.keep_alive_s,
        log_config=log_config(log_level),
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=5,
    )


class _Stderr:
    """``sys.stderr`` as it is at each write: while the model-loading line is live on a
    terminal, rich's stand-in for it, which prints each log line above that line."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def log_config(level: str) -> dict[str, Any]:
    """uvicorn's logging configuration with draftgate's own packages logged beside it, at
    ``level``, on uvicorn's console handler (otherwise only their warnings reach the
    console, and "model loaded" never does), writing to stderr as it is at each line."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["default"]["stream"] = _Stderr()
    ours = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    config["loggers"].update({package: dict(ours) for package in OWN_PACKAGES})
    return config


def _run(settings: Settings, host: str, port: int, allow_public: bool, access_log: bool) -> None:
    from gateway.app import create_app
    from gateway.cli.load_progress import watch_loads

    try:
        check_bind(settings, host, allow_public)
        if allow_public:  # also serves Host names other than loopback ones without keys
            settings = settings.model_copy(update={"allow_public_bind": True})
        app = create_app(settings)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    watch_loads(app.state.runtime.local)
    run_server(app, host, port, server=settings.server, access_log=access_log)


ACCESS_LOG = typer.Option(False, "--access-log", help="Log one line per request.")


def serve_command(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="TOML file (default: ./draftgate.toml if present)."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="Port to bind."),
    allow_public: bool = typer.Option(
        False, "--allow-public", help="Allow a non-loopback bind without gateway keys."
    ),
    access_log: bool = ACCESS_LOG,
) -> None:
    """Run the gateway (no config: a local SmolLM2-135M endpoint and an in-memory store).

    Local models load in the background: the log says when each starts and finishes, and
    on a terminal a live line shows the loads under way with the time taken so far."""
    try:
        settings = load_settings(config)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None
    _run(settings, host, port, allow_public, access_log)


def verifier_command(
    model: str = typer.Option(
        ..., "--model", "-m", help="Local model: path (HF dir or .gguf) or alias."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8001, help="Port to bind."),
    device: str | None = typer.Option(None, help="torch device (default: best available)."),
    dtype: str | None = typer.Option(
        None,
        help="float32, bf16 or native (a .gguf file's quantized blocks as they are; each is a different target); default: bf16 on CUDA and CPUs with bf16 arithmetic, else float32.",
    ),
    max_batch: int | None = typer.Option(
        None, "--max-batch", min=1, help="Requests running at once (default 16); more wait."
    ),
    allow_public: bool = typer.Option(
        False, "--allow-public", help="Allow a non-loopback bind (no auth!)."
    ),
    access_log: bool = ACCESS_LOG,
) -> None:
    """Serve one local model with OpenAI's API, including Predicted Outputs."""
    settings = verifier_settings(model, device, dtype, max_batch)
    _run(settings, host, port, allow_public, access_log)
