"""`undolog audit export|verify|head`: the org's hash-chained audit file (docs/audit.md).

`export` reads the database straight (like `migrate` and `keys`: an operator with the
database URL, no API key and no running proxy needed) and writes one JSON line per event of
the org; `verify` needs only the file. Exit codes: 0 done / the file verifies, 1 the file
does not verify (the line and the reason are printed) or the history no longer matches the
stored head, 2 bad usage.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from undolog.cli_keys import on_store

__all__ = ["audit_app"]

audit_app = typer.Typer(add_completion=False, help="Export and verify the hash-chained audit.")

_DB = typer.Option(None, "--database-url", help="(env UNDOLOG_DATABASE_URL)")
_CONFIG = typer.Option(None, "--config", help="TOML config file (env UNDOLOG_CONFIG)")
_ORG = typer.Option(..., "--org", help="The org whose records to export")


def _since_us(since: str | None) -> int | None:
    if since is None:
        return None
    try:
        when = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        typer.echo(f"error: --since: not an ISO 8601 time: {since!r}", err=True)
        raise typer.Exit(2) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1_000_000)


@audit_app.command("export")
def audit_export(
    org: str = _ORG,
    since: str = typer.Option(
        None,
        "--since",
        help="Rebuild the chain from its start and write the records from this ISO 8601 time "
        "on (default: the records after the last export, chained on its head)",
    ),
    output: Path = typer.Option(None, "--output", "-o", help="The file (default: stdout)"),
    database_url: str = _DB,
    config: str = _CONFIG,
) -> None:
    """Write the org's audit records as hash-chained JSON Lines; print and store the head."""
    from undolog.engine.audit import export_org
    from undolog.engine.model import now_us

    since_us = _since_us(since)
    out = output.open("w", encoding="utf-8") if output else sys.stdout
    try:
        result = on_store(
            database_url,
            config,
            lambda store: export_org(store, org, out.write, since_us=since_us, now_us=now_us()),
        )
    finally:
        if output:
            out.close()
    report = sys.stdout if output else sys.stderr
    print(f"wrote {result.written} records of org {org} ({result.count} in the chain)", file=report)
    print(f"chained on: {result.prev}", file=report)
    print(f"head: {result.head}", file=report)
    if result.diverged_at is not None:
        print(
            f"error: record {result.diverged_at} no longer matches the stored head: the history "
            "changed after it was exported; the head was not moved",
            file=sys.stderr,
        )
        raise typer.Exit(1)


@audit_app.command("verify")
def audit_verify(
    file: Path = typer.Argument(..., help="A file written by `undolog audit export`"),
    head: str = typer.Option(
        None,
        "--head",
        help="The head the export printed (or `audit head` shows): the last "
        "record must have it, so lines cut off the end are found",
    ),
    prev: str = typer.Option(
        None,
        "--prev",
        help="The hash the file chains on (`chained on:` of its export); default: the genesis",
    ),
) -> None:
    """Check every record's hash and link; name the first line that was changed."""
    from undolog.engine.audit import verify_lines

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        typer.echo(f"error: cannot read {file}: {exc}", err=True)
        raise typer.Exit(2) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last record
    verdict = verify_lines(lines, prev=prev, head=head)
    if not verdict.ok:
        typer.echo(f"{file}: line {verdict.line}: {verdict.reason}", err=True)
        raise typer.Exit(1)
    typer.echo(f"{file}: OK, {verdict.records} records, head {verdict.head}")


@audit_app.command("head")
def audit_head(org: str = _ORG, database_url: str = _DB, config: str = _CONFIG) -> None:
    """The stored head of the org's chain: hash, records, last event, when exported."""

    async def read(store: Any) -> Any:
        async with store.reader() as q:
            return await q.get_audit_head(org)

    stored = on_store(database_url, config, read)
    if stored is None:
        typer.echo(f"org {org}: never exported")
        return
    from undolog.engine.audit import iso_us

    typer.echo(
        f"org {org}: head {stored.head_hash}, {stored.record_count} records, "
        f"last event {stored.last_event_id}, exported {iso_us(stored.exported_us)}"
    )
