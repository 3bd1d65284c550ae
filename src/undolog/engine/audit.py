"""The audit chain: an org's events as hash-chained JSON Lines, and their verification.

Every event row of an org (calls, approval decisions with the deciding key's name or rule,
compensations, operator resolutions; see docs/audit.md) becomes one record, in event order:

    {"n": 7, "prev": "<hash of record 6>", "event_id": 42, "type": "approval_approved",
     "at": "2026-12-01T09:30:00.123456Z", "org_id": "acme", "session_id": "...",
     "effect_id": "...", "data": {...the event's payload...},
     "call": {"tool_name": "...", "step_index": 2, "tier": "irreversible",
              "args_sha256": "..."},
     "hash": "<SHA-256 hex of the canonical JSON of this record without `hash`>"}

`call` is present when the event names an effect. The first record of the chain has `prev`
`GENESIS`; an export that chains on from the last one starts with that export's head. The
canonical JSON is the call signature's (`undolog_sdk.canonical_json`: keys sorted, compact),
so the hash of a line can be recomputed by anyone. `verify_lines` finds the first line that
was edited, removed, reordered, inserted or cut.

`export_org` reads the store; the rest is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from undolog.store.protocol import Queries, Store
from undolog.store.records import AuditHeadRecord, EffectRecord, EventRecord
from undolog_sdk.errors import InvalidRequest, NotFound
from undolog_sdk.signature import canonical_json

__all__ = [
    "GENESIS",
    "AuditExport",
    "Verdict",
    "chain_record",
    "export_org",
    "iso_us",
    "record_hash",
    "verify_lines",
]

GENESIS = "0" * 64  # the `prev` of a chain's first record
_PAGE = 1000  # events read per query
_RACED = "another export of this org stored its head first; run the export again"


def record_hash(record: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of `record` without its `hash`."""
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def iso_us(us: int) -> str:
    """Microseconds since the epoch as ISO 8601 UTC with microseconds."""
    when = datetime.fromtimestamp(us / 1_000_000, tz=UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _call(effect: EffectRecord) -> dict[str, Any]:
    return {
        "tool_name": effect.tool_name,
        "step_index": effect.step_index,
        "tier": effect.tier,
        "args_sha256": hashlib.sha256(effect.args_json.encode("utf-8")).hexdigest(),
    }


def chain_record(
    event: EventRecord, n: int, prev: str, effect: EffectRecord | None
) -> dict[str, Any]:
    """The audit record of one event, `n`th in the chain, chained on `prev`."""
    record: dict[str, Any] = {
        "n": n,
        "prev": prev,
        "event_id": event.event_id,
        "type": event.type,
        "at": iso_us(event.created_us),
        "org_id": event.org_id,
        "session_id": event.session_id,
        "effect_id": event.effect_id,
        "data": orjson.loads(event.payload_json),
    }
    if effect is not None:
        record["call"] = _call(effect)
    record["hash"] = record_hash(record)
    return record


@dataclass(frozen=True, slots=True)
class AuditExport:
    """What an export wrote: `written` records chained on `prev`, ending at `head`."""

    org_id: str
    prev: str  # the `prev` of the first written record (GENESIS or an earlier head)
    head: str  # the hash of the chain's last record (stored)
    written: int
    count: int  # records in the whole chain
    diverged_at: int | None = None  # the chain's record that no longer matches the stored head


async def export_org(
    store: Store,
    org_id: str,
    write: Callable[[str], object],
    *,
    since_us: int | None = None,
    now_us: int,
) -> AuditExport:
    """Write the org's audit records as JSON lines (`write` gets each, newline included)
    and store the chain's new head.

    Without `since_us`, the export chains on from the stored head: the records of events
    after the last export. With it, the chain is rebuilt from its start and the records at
    or after `since_us` are written; should a rebuilt record differ from the stored head
    (the history was changed after it was exported), `diverged_at` names it and the head is
    not moved.

    Raises:
        NotFound: no such org.
        InvalidRequest: another export moved the head meanwhile (nothing is stored: run
            the export again).
    """
    async with store.reader() as q:
        if await q.get_org(org_id) is None:
            raise NotFound(f"org '{org_id}' not found")
        stored = await q.get_audit_head(org_id)
        resume = stored is not None and since_us is None
        after = stored.last_event_id if resume and stored else 0
        prev = stored.head_hash if resume and stored else GENESIS
        n = stored.record_count if resume and stored else 0
        first_prev: str | None = None
        written, last_event, diverged = 0, after, None
        effects: dict[str, EffectRecord | None] = {}
        while True:
            page = await q.list_events(org_id, after, _PAGE)
            for event in page:
                n += 1
                record = chain_record(event, n, prev, await _effect(q, effects, event))
                prev, last_event = record["hash"], event.event_id
                at_head = stored is not None and not resume and n == stored.record_count
                if (
                    at_head
                    and stored
                    and (event.event_id, prev)
                    != (
                        stored.last_event_id,
                        stored.head_hash,
                    )
                ):
                    diverged = diverged or n
                if since_us is None or event.created_us >= since_us:
                    first_prev = record["prev"] if first_prev is None else first_prev
                    write(canonical_json(record) + "\n")
                    written += 1
            if len(page) < _PAGE:
                break
            after = page[-1].event_id
    if stored is not None and not resume and n < stored.record_count:
        diverged = diverged or n + 1  # the history lost records that were exported
    result = AuditExport(org_id, first_prev or prev, prev, written, n, diverged)
    if diverged is None and (stored is None or n != stored.record_count):
        head = AuditHeadRecord(org_id, prev, last_event, n, now_us)
        async with store.transaction() as q:
            if not await q.put_audit_head(head, stored.head_hash if stored else None):
                raise InvalidRequest(_RACED)
    return result


async def _effect(
    q: Queries, cache: dict[str, EffectRecord | None], event: EventRecord
) -> EffectRecord | None:
    if event.effect_id is None:
        return None
    if event.effect_id not in cache:
        cache[event.effect_id] = await q.get_effect(event.org_id, event.effect_id)
    return cache[event.effect_id]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A file's verification: `ok`, how many records, the last hash; else the first bad
    line (1-based) and why."""

    ok: bool
    records: int
    head: str
    line: int | None = None
    reason: str | None = None


def verify_lines(
    lines: Iterable[str], *, prev: str | None = None, head: str | None = None
) -> Verdict:
    """Check a chain file: every line's hash, every `prev` link and `n` step, the first
    record's `prev` (`prev`, or GENESIS), and, given `head`, the last record's hash (which
    catches lines cut off the end)."""
    expected_prev = prev or GENESIS
    last_n: int | None = None
    count = 0
    for number, line in enumerate(lines, 1):
        count = number
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return Verdict(False, number - 1, expected_prev, number, "not a JSON record")
        if not isinstance(record, dict) or not isinstance(record.get("hash"), str):
            return Verdict(False, number - 1, expected_prev, number, "not an audit record")
        if record_hash(record) != record["hash"]:
            return Verdict(False, number - 1, expected_prev, number, "its hash does not match")
        if record.get("prev") != expected_prev:
            why = (
                "it does not chain on the genesis or --prev (a record before it is missing?)"
                if number == 1
                else "it does not chain on the line before (removed, inserted or moved lines)"
            )
            return Verdict(False, number - 1, expected_prev, number, why)
        n = record.get("n")
        if not isinstance(n, int) or (last_n is not None and n != last_n + 1):
            return Verdict(False, number - 1, expected_prev, number, "its record number skips")
        last_n, expected_prev = n, record["hash"]
    if head is not None and head != expected_prev:
        why = f"the last record's hash is {expected_prev}, not the head {head} (lines cut off?)"
        return Verdict(False, count, expected_prev, count + 1, why)
    return Verdict(True, count, expected_prev)
