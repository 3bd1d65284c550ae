"""`undolog keys create|list|revoke`: API keys, straight in the database (like `migrate`).

A key made here persists across restarts (source `cli`) until revoked; the config's own keys
are managed by the config. `create` prints the key once — only its SHA-256 is stored; `list`
never prints a key or a hash. A revoked key stops working within the proxies' key cache
time (5 s) and its dashboard sessions end at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from undolog.config import load_settings

__all__ = ["keys_app", "on_store"]

keys_app = typer.Typer(add_completion=False, help="Create, list and revoke API keys.")

_DB = typer.Option(None, "--database-url", help="(env UNDOLOG_DATABASE_URL)")
_CONFIG = typer.Option(None, "--config", help="TOML config file (env UNDOLOG_CONFIG)")
_JSON = typer.Option(False, "--json", help="Print JSON")
T = TypeVar("T")


def on_store(
    database_url: str | None, config: str | None, action: Callable[[Any], Awaitable[T]]
) -> T:
    """Run `action(store)` on the database the flags (or env, or config) name, migrated;
    an UndoLog error is printed and exits 1, bad settings exit 2. Also `undolog audit`'s."""
    try:
        settings = load_settings({"database_url": database_url, "config": config})
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run() -> T:
        from undolog.store import open_store

        store = await open_store(settings.database_url)
        try:
            await store.migrate()
            return await action(store)
        finally:
            await store.close()

    from undolog_sdk.errors import UndoLogError

    try:
        return asyncio.run(run())
    except UndoLogError as exc:
        typer.echo(f"error: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(1) from None


def _with_keys(
    database_url: str | None, config: str | None, action: Callable[[Any], Awaitable[T]]
) -> T:
    from undolog.engine.keys import Keys

    return on_store(database_url, config, lambda store: action(Keys(store)))


def _when(us: int | None) -> str:
    return iso_or_none(us) or "-"


def iso_or_none(us: int | None) -> str | None:
    from undolog.proxy.wire import iso

    return iso(us)


def _print_json(data: Any) -> None:
    from undolog.cli_ops import _print_json as print_json

    print_json(data)


@keys_app.command("create")
def create(
    org: str = typer.Option(..., "--org", help="The org the key belongs to"),
    name: str = typer.Option(..., "--name", help="A name for people (recorded as the decider)"),
    role: str = typer.Option(..., "--role", help="agent, approver or admin"),
    database_url: str = _DB,
    config: str = _CONFIG,
    as_json: bool = _JSON,
) -> None:
    """Make a key and print it once (only its SHA-256 is stored)."""

    async def act(keys: Any) -> tuple[str, Any]:
        secret, record = await keys.create(org, name, role)
        return secret, record

    secret, record = _with_keys(database_url, config, act)
    if as_json:
        _print_json({"key_id": record.key_id, "org_id": record.org_id, "name": record.name,
                     "role": record.role, "key": secret})  # fmt: skip
        return
    typer.echo(f"key id: {record.key_id}\norg:    {record.org_id}\nname:   {record.name}")
    typer.echo(f"role:   {record.role}\nkey:    {secret}\n(the key is shown only this once)")


@keys_app.command("list")
def list_keys(
    org: str = typer.Option(None, "--org", help="Only this org's keys"),
    database_url: str = _DB,
    config: str = _CONFIG,
    as_json: bool = _JSON,
) -> None:
    """The keys: id, org, name, role, source, created, last used, revoked (never the key)."""
    from undolog.cli_ops import _table

    async def act(keys: Any) -> list[Any]:
        found: list[Any] = await keys.list(org)
        return found

    records = _with_keys(database_url, config, act)
    if as_json:  # never the key or its hash
        _print_json([
            {"key_id": r.key_id, "org_id": r.org_id, "name": r.name, "role": r.role,
             "source": r.source, "created_at": _when(r.created_us),
             "last_used_at": iso_or_none(r.last_used_us), "revoked_at": iso_or_none(r.revoked_us)}
            for r in records
        ])  # fmt: skip
        return
    rows = [
        [r.key_id, r.org_id, r.name, r.role, r.source, _when(r.created_us),
         _when(r.last_used_us), _when(r.revoked_us)]
        for r in records
    ]  # fmt: skip
    headers = ["id", "org", "name", "role", "source", "created", "last used", "revoked"]
    typer.echo(_table(rows, headers))


@keys_app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., help="The key's id (from `undolog keys list`)"),
    database_url: str = _DB,
    config: str = _CONFIG,
    as_json: bool = _JSON,
) -> None:
    """Revoke a key: it stops working (within 5 s) and its dashboard sessions end."""

    async def act(keys: Any) -> None:
        await keys.revoke(key_id)

    _with_keys(database_url, config, act)
    if as_json:
        _print_json({"key_id": key_id, "revoked": True})
        return
    typer.echo(f"revoked {key_id}")
