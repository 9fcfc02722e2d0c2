"""``draftgate index`` and ``draftgate documents ls|rm``: a namespace's documents in Redis.

These commands talk to the document store directly (the in-memory store lives inside a
running gateway, so they need Redis: ``--redis-url`` or ``REDIS_URL``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer

if TYPE_CHECKING:
    from lookup.corpus import Corpus

CLI_TIMEOUT_S = 5.0
T = TypeVar("T")

documents_app = typer.Typer(
    help="List or remove a namespace's stored documents.", no_args_is_help=True
)

REDIS_URL = typer.Option(
    None, "--redis-url", envvar="REDIS_URL", help="Redis URL (redis:// or redis+cluster://)."
)
NAMESPACE = typer.Option(..., "--namespace", "-n", help="The namespace (tenant) to work on.")
PREFIX = typer.Option("dg:", "--prefix", help="Key prefix; must match the gateway's.")


def _open_corpus(redis_url: str | None, prefix: str) -> Corpus:
    from lookup.corpus import Corpus, open_store

    if not redis_url:
        typer.echo(
            "error: no Redis to talk to: pass --redis-url or set REDIS_URL "
            "(a gateway without Redis keeps documents in its own memory; "
            "upload those through POST /v1/documents).",
            err=True,
        )
        raise typer.Exit(2)
    try:
        store = open_store(redis_url, prefix=prefix, timeout_s=CLI_TIMEOUT_S)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return Corpus(store)


def _unavailable(exc: Exception) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(1)


def _on_corpus(redis_url: str | None, prefix: str, work: Callable[[Corpus], Awaitable[T]]) -> T:
    """Run ``work`` on the store's corpus and close it; an unreachable store exits 1."""
    from lookup.corpus import StoreUnavailable

    async def run() -> T:
        corpus = _open_corpus(redis_url, prefix)
        try:
            return await work(corpus)
        finally:
            await corpus.aclose()

    try:
        return asyncio.run(run())
    except StoreUnavailable as exc:
        raise _unavailable(exc) from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def index_command(
    path: Path = typer.Argument(..., exists=True, help="A directory (or one file) to upload."),
    namespace: str = NAMESPACE,
    redis_url: str | None = REDIS_URL,
    prefix: str = PREFIX,
    max_file_bytes: int = typer.Option(
        1 << 20, "--max-file-bytes", min=1, help="Skip files larger than this."
    ),
    progress: bool = typer.Option(
        True,
        "--progress/--no-progress",
        help="Show progress on stderr: a live bar on a terminal, plain lines otherwise.",
    ),
    include_secrets: bool = typer.Option(
        False, "--include-secrets", help="Also upload .env, *.pem, id_rsa* and the like."
    ),
) -> None:
    """Upload a directory's text files as documents (honours .gitignore, skips binaries
    and files that usually hold credentials)."""
    asyncio.run(
        _index(path, namespace, redis_url, prefix, max_file_bytes, progress, include_secrets)
    )


async def _index(
    path: Path,
    ns: str,
    redis_url: str | None,
    prefix: str,
    max_bytes: int,
    progress: bool,
    include_secrets: bool,
) -> None:
    from gateway.progress import track
    from lookup.corpus import CorpusError, DocumentTooLarge, StoreUnavailable
    from sdk.files import FoundFile, iter_files, read_text_file
    from sdk.languages import language_for

    corpus = _open_corpus(redis_url, prefix)
    if path.is_dir():
        found = list(iter_files(path, max_bytes=max_bytes, include_secrets=include_secrets))
    else:
        text, why = read_text_file(path, max_bytes)
        found = [FoundFile(path.name, path, text, why)]
    skipped = Counter(f.skipped for f in found if f.skipped)
    uploads = [(f.rel, f.text) for f in found if f.text is not None]
    uploaded = uploaded_bytes = 0
    try:
        for rel, text in track(uploads, f"indexing {ns}", enabled=progress):
            try:
                meta = await corpus.put(ns, rel, text, path=rel, language=language_for(rel))
            except DocumentTooLarge:
                skipped["too_large"] += 1
                continue
            uploaded += 1
            uploaded_bytes += meta.bytes
        held = len(await corpus.list(ns))
    except StoreUnavailable as exc:
        raise _unavailable(exc) from None
    except CorpusError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        await corpus.aclose()
    reasons = ", ".join(f"{n} {why.replace('_', ' ')}" for why, n in sorted(skipped.items()))
    typer.echo(
        f"Indexed {uploaded} files ({_human(uploaded_bytes)}) into namespace {ns!r}; "
        f"skipped: {reasons or 'none'}. The namespace holds {held} documents."
    )
    if held < uploaded:
        typer.echo(
            f"note: the namespace's caps ({corpus.limits.max_ns_docs} documents, "
            f"{_human(corpus.limits.max_ns_bytes)}) evicted the least recently used."
        )


@documents_app.command("ls")
def ls_command(
    namespace: str = NAMESPACE, redis_url: str | None = REDIS_URL, prefix: str = PREFIX
) -> None:
    """List the namespace's documents, most recently used first."""
    from rich.console import Console
    from rich.table import Table

    docs = _on_corpus(redis_url, prefix, lambda corpus: corpus.list(namespace))
    table = Table("id", "bytes", "language", "last used (UTC)", box=None)
    for d in docs:
        used = datetime.fromtimestamp(d.last_used, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(d.id, str(d.bytes), d.language or "-", used)
    console = Console(width=200)
    console.print(table)
    console.print(f"{len(docs)} documents, {_human(sum(d.bytes for d in docs))}")


@documents_app.command("rm")
def rm_command(
    ids: list[str] = typer.Argument(..., help="Document ids to remove."),
    namespace: str = NAMESPACE,
    redis_url: str | None = REDIS_URL,
    prefix: str = PREFIX,
) -> None:
    """Remove documents by id (exit status 1 when one was not there)."""

    async def delete(corpus: Corpus) -> list[bool]:
        return [await corpus.delete(namespace, i) for i in ids]

    removed = _on_corpus(redis_url, prefix, delete)
    for doc_id, ok in zip(ids, removed, strict=True):
        typer.echo(f"{'removed' if ok else 'not found'}: {doc_id}")
    if not all(removed):
        raise typer.Exit(1)
