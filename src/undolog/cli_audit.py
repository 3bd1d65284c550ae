"""`undolog audit export|verify|head`: the org's hash-chained audit file (docs/audit.md).

`export` reads the database straight (like `migrate` and `keys`: an operator with the
database URL, no API key and no running proxy needed), rebuilds the org's chain from its start,
writes one JSON line per new record, prints the new head as an anchor `n:hash` and may append
it to an operator-kept `--anchor-file`. `verify` checks files (from the genesis, or `--prev`),
or with `--org` and no file the database's chain, against `--head` and `--anchor-file`. Exit
codes: 0 done / it verifies, 1 it does not (the line or record and the reason are printed: an
edit, a gap in the event sequence, an anchor or the stored head no longer matched), 2 bad usage.
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
_ANCHOR_FILE_HELP = (
    "A file of anchors `org n:hash time`, kept where the database's writers cannot change it"
)


def _anchors(path: Path | None, org: str) -> list[Any]:
    """The org's anchors in `path` (none when no file is given; a missing file is empty)."""
    from undolog.engine.audit import anchors_of

    if path is None or not path.exists():
        return []
    try:
        return anchors_of(path.read_text(encoding="utf-8").splitlines(), org)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        typer.echo(f"error: --anchor-file {path}: {exc}", err=True)
        raise typer.Exit(2) from None


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
        help="Write the records from this ISO 8601 time on (default: the records after the "
        "last export, chained on its head)",
    ),
    output: Path = typer.Option(None, "--output", "-o", help="The file (default: stdout)"),
    anchor_file: Path = typer.Option(
        None,
        "--anchor-file",
        help=f"{_ANCHOR_FILE_HELP}: the chain must match the org's anchors in it, and the new "
        "head is appended",
    ),
    database_url: str = _DB,
    config: str = _CONFIG,
) -> None:
    """Write the org's audit records as hash-chained JSON Lines; print and store the head.

    The whole chain is rebuilt and checked first (gaps, the stored head, the anchors)."""
    from undolog.engine.audit import anchor_line, export_org
    from undolog.engine.model import now_us

    since_us = _since_us(since)
    anchors = _anchors(anchor_file, org)
    out = output.open("w", encoding="utf-8") if output else sys.stdout
    try:
        result = on_store(
            database_url,
            config,
            lambda store: export_org(
                store, org, out.write, since_us=since_us, now_us=now_us(), anchors=anchors
            ),
        )
    finally:
        if output:
            out.close()
    report = sys.stdout if output else sys.stderr
    pruned = f", {_pruned(result.pruned)}" if result.pruned else ""
    print(
        f"wrote {result.written} records of org {org} ({result.count} in the chain{pruned})",
        file=report,
    )
    print(f"chained on: {result.prev}", file=report)
    print(f"head: {result.head}", file=report)
    if result.problem is not None:
        print(f"error: {result.problem}; the head was not moved", file=sys.stderr)
        raise typer.Exit(1)
    if result.anchor is not None:
        # Keep it outside the database: a later export or verify checks the chain against it.
        print(f"anchor: {result.anchor}", file=report)
        if anchor_file is not None:
            try:
                with anchor_file.open("a", encoding="utf-8") as kept:
                    kept.write(anchor_line(org, result.anchor, now_us()))
            except OSError as exc:
                typer.echo(f"error: cannot append to {anchor_file}: {exc}", err=True)
                raise typer.Exit(1) from None


@audit_app.command("verify")
def audit_verify(
    files: list[Path] = typer.Argument(
        None, help="Files written by `undolog audit export`, in order (one chain)"
    ),
    head: str = typer.Option(
        None,
        "--head",
        help="N:HASH (the `anchor:` an export printed): record N must have that hash; or a "
        "bare HASH the last record must have",
    ),
    prev: str = typer.Option(
        None,
        "--prev",
        help="The hash the first file chains on (`chained on:` of its export); default: the "
        "genesis",
    ),
    anchor_file: Path = typer.Option(None, "--anchor-file", help=_ANCHOR_FILE_HELP),
    org: str = typer.Option(
        None,
        "--org",
        help="Whose anchors to use; with no file, verify this org's chain in the database",
    ),
    database_url: str = _DB,
    config: str = _CONFIG,
) -> None:
    """Check every record's hash and link from the start; name the first thing changed."""
    from undolog.engine.audit import Anchor

    anchors: list[Anchor] = []
    bare_head: str | None = None
    if head is not None:
        try:
            anchors.append(Anchor.parse(head) if ":" in head else Anchor(0, head))
        except ValueError as exc:
            typer.echo(f"error: --head: {exc}", err=True)
            raise typer.Exit(2) from None
        if anchors[-1].n == 0:
            bare_head = anchors.pop().head
    if not files:
        if org is None:
            typer.echo("error: give the files to verify, or --org to verify the database", err=True)
            raise typer.Exit(2)
        if bare_head is not None:
            typer.echo("error: --head: give N:HASH to check the database", err=True)
            raise typer.Exit(2)
        _verify_database(org, anchors + _anchors(anchor_file, org), database_url, config)
        return
    _verify_files(files, prev, bare_head, anchors, anchor_file, org)


def _verify_files(
    files: list[Path],
    prev: str | None,
    head: str | None,
    anchors: list[Any],
    anchor_file: Path | None,
    org: str | None,
) -> None:
    from undolog.engine.audit import verify_lines

    lines: list[str] = []
    starts: list[tuple[int, Path]] = []  # (first line, file): to name the file of a line
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            typer.echo(f"error: cannot read {file}: {exc}", err=True)
            raise typer.Exit(2) from None
        part = text.split("\n")
        if part and part[-1] == "":
            part.pop()  # the newline that ends the last record
        starts.append((len(lines) + 1, file))
        lines += part
    if anchor_file is not None:
        owner = org or _org_of(lines)
        anchors = anchors + (_anchors(anchor_file, owner) if owner else [])
    verdict = verify_lines(lines, prev=prev, head=head, anchors=anchors)
    name = " + ".join(str(f) for f in files)
    if not verdict.ok:
        line = verdict.line or 0
        first, file = next(((f, p) for f, p in reversed(starts) if f <= line), starts[0])
        where = f"{file}: line {line - first + 1}" if len(files) > 1 else f"{file}: line {line}"
        typer.echo(f"{where}: {verdict.reason}", err=True)
        raise typer.Exit(1)
    pruned = f" ({_pruned(verdict.pruned)})" if verdict.pruned else ""
    typer.echo(f"{name}: OK, {verdict.records} records{pruned}, head {verdict.head}")


def _org_of(lines: list[str]) -> str | None:
    import orjson

    for line in lines:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return None
        if isinstance(record, dict) and isinstance(record.get("org_id"), str):
            return str(record["org_id"])
    return None


def _verify_database(
    org: str, anchors: list[Any], database_url: str | None, config: str | None
) -> None:
    from undolog.engine.audit import verify_org

    check = on_store(database_url, config, lambda store: verify_org(store, org, anchors))
    if not check.ok:
        typer.echo(f"org {org}: record {check.at}: {check.problem}", err=True)
        raise typer.Exit(1)
    pruned = f" ({_pruned(check.pruned)})" if check.pruned else ""
    typer.echo(f"org {org}: OK, {check.count} records{pruned}, head {check.anchor or '-'}")


def _pruned(count: int) -> str:
    return f"{count} {'event' if count == 1 else 'events'} pruned by retention"


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
