"""The ``draftgate`` command line.

Subcommands live in their own modules and are registered here; heavy imports stay inside
the command functions so ``draftgate --help`` is fast and needs no torch.
"""

from __future__ import annotations

import typer

from gateway.cli.audit import audit_command
from gateway.cli.documents import documents_app, index_command
from gateway.cli.endpoints import endpoints_command
from gateway.cli.serve import serve_command, verifier_command
from sdk import __version__

app = typer.Typer(
    name="draftgate",
    help="OpenAI-compatible gateway that drafts known text and verifies it losslessly.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"draftgate {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """draftgate command line."""


app.command("index")(index_command)
app.add_typer(documents_app, name="documents")
app.command("endpoints")(endpoints_command)
app.command("audit")(audit_command)
app.command("serve")(serve_command)
app.command("verifier")(verifier_command)


def main() -> None:
    """Console-script entry point."""
    app()
