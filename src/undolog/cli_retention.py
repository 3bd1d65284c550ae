"""`undolog prune`: delete what orgs' retention lets go, now (docs/retention.md).

The same pruning as the server's background sweep, in batches of `--batch-size` sessions,
each its own short transaction, so a running server's calls keep going. Each org's
`retention_days` comes from the database (the server writes the config's at start); with
`--config`, the file's value wins for the orgs it declares.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson
import typer

from undolog.config import DEFAULT_RETENTION_BATCH_SIZE, MAX_RETENTION_BATCH_SIZE, load_settings
from undolog_sdk.errors import UndoLogError

if TYPE_CHECKING:
    from undolog.engine.retention import PruneCounts

__all__ = ["prune"]


def prune(
    database_url: str = typer.Option(None, help="(env UNDOLOG_DATABASE_URL)"),
    config: str = typer.Option(None, help="TOML config file (its orgs' retention_days win)"),
    org: str = typer.Option(None, "--org", help="Only this org"),
    batch_size: int = typer.Option(
        DEFAULT_RETENTION_BATCH_SIZE,
        "--batch-size",
        min=1,
        max=MAX_RETENTION_BATCH_SIZE,
        help="Sessions deleted per transaction",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON"),
) -> None:
    """Prune finished sessions older than their org's retention_days, with their rows."""
    try:
        settings = load_settings({"database_url": database_url, "config": config})
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    days = {o.org_id: o.retention_days for o in settings.orgs if o.retention_days is not None}

    async def run() -> dict[str, PruneCounts]:
        from undolog.engine.retention import Retention
        from undolog.store import open_store

        store = await open_store(settings.database_url)
        try:
            await store.migrate()
            return await Retention(store).prune(
                org, batch_size=batch_size, dry_run=dry_run, days=days
            )
        finally:
            await store.close()

    try:
        report = asyncio.run(run())
    except UndoLogError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        body = {"dry_run": dry_run, "orgs": {o: c.as_dict() for o, c in report.items()}}
        typer.echo(orjson.dumps(body).decode())
        return
    if not report:
        which = f"org {org!r} keeps" if org else "every org keeps"
        typer.echo(f"nothing to prune: {which} everything (no retention_days)")
        return
    verb = "would prune" if dry_run else "pruned"
    for org_id, counts in report.items():
        parts = ", ".join(f"{n} {table}" for table, n in counts.as_dict().items())
        typer.echo(f"{org_id}: {verb} {parts}")
