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

Records are numbered by the events' contiguous per-org sequence (`audit_seq`, migration 24):
record `n` is the org's `n`th event, so an event deleted from the database leaves a gap that
every export and `verify_org` names. Every export rebuilds the chain from its start and checks
it against the stored head and the operator's anchors (`Anchor`: `n:hash` kept outside the
database), so a row changed after it was exported is found by the next export, incremental or
not, and a history rewritten after the stored head was deleted does not match a kept anchor.

`export_org` and `verify_org` read the store; the rest is pure.
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
    "Anchor",
    "AuditExport",
    "ChainCheck",
    "Verdict",
    "anchor_line",
    "anchors_of",
    "chain_record",
    "export_org",
    "iso_us",
    "record_hash",
    "verify_lines",
    "verify_org",
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
class Anchor:
    """A chain head kept outside the database: record `n` of the chain has hash `head`.

    Written `n:hash` (`audit export` prints it and appends it to `--anchor-file`); whoever can
    write the database cannot change a copy the operator keeps elsewhere.
    """

    n: int
    head: str

    @classmethod
    def parse(cls, text: str) -> Anchor:
        """`N:HASH` (N >= 1, HASH 64 lower-case hex digits).

        Raises:
            ValueError: anything else.
        """
        n, sep, head = text.strip().partition(":")
        if not sep or not n.isascii() or not n.isdigit() or int(n) < 1 or not _is_hash(head):
            raise ValueError(f"not an anchor N:HASH: {text.strip()!r}")
        return cls(int(n), head)

    def __str__(self) -> str:
        return f"{self.n}:{self.head}"


def _is_hash(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def anchor_line(org_id: str, anchor: Anchor, at_us: int) -> str:
    """One line of an anchor file: `org n:hash time` (newline included)."""
    return f"{org_id} {anchor} {iso_us(at_us)}\n"


def anchors_of(lines: Iterable[str], org_id: str) -> list[Anchor]:
    """The org's anchors in the lines of an anchor file (blank and `#` lines skipped).

    Raises:
        ValueError: a line that is no `org n:hash [time]` (with its line number).
    """
    found = []
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            if len(words) < 2:
                raise ValueError(f"not an anchor line: {line.strip()!r}")
            anchor = Anchor.parse(words[1])
        except ValueError as exc:
            raise ValueError(f"anchor file line {number}: {exc}") from None
        if words[0] == org_id:
            found.append(anchor)
    return found


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """A rebuilt chain: `count` records ending at `head`; `problem` the first thing wrong with
    it (None: it is whole and matches every anchor and the stored head), at record `at`."""

    org_id: str
    count: int
    head: str
    problem: str | None = None
    at: int | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def anchor(self) -> Anchor | None:
        return Anchor(self.count, self.head) if self.count else None


class _Checker:
    """Holds a chain being rebuilt to its anchors: records must come numbered 1, 2, 3, ..."""

    def __init__(self, anchors: Iterable[Anchor], stored: AuditHeadRecord | None) -> None:
        self.anchors: dict[int, dict[str, str]] = {}  # n -> {hash: what named it}
        for anchor in anchors:
            self.anchors.setdefault(anchor.n, {})[anchor.head] = f"the anchor {anchor}"
        if stored is not None:
            self.anchors.setdefault(stored.record_count, {})[stored.head_hash] = "the stored head"
        self.problem: tuple[str, int] | None = None

    def fail(self, why: str, at: int) -> None:
        if self.problem is None:
            self.problem = (why, at)

    def gap(self, expected: int, seq: int) -> None:
        missing = str(expected) if seq - 1 == expected else f"{expected}..{seq - 1}"
        self.fail(f"events {missing} are missing from the database (deleted)", expected)

    def record(self, n: int, hash_: str) -> None:
        for head, what in self.anchors.get(n, {}).items():
            if head != hash_:
                self.fail(
                    f"record {n} no longer matches {what}: the history changed after it "
                    "was exported",
                    n,
                )

    def end(self, count: int) -> None:
        beyond = [n for n in self.anchors if n > count]
        if beyond:
            self.fail(
                f"the chain has {count} records, but an anchor names record {min(beyond)}: "
                "records were removed",
                count + 1,
            )


async def _rebuild(
    q: Queries,
    org_id: str,
    check: _Checker,
    on_record: Callable[[dict[str, Any], EventRecord], object],
) -> tuple[int, str, int]:
    """Rebuild the org's chain from the genesis, every event in sequence order; returns
    (records, head hash, last event id). Gaps in the sequence go to `check`."""
    last = await q.last_audit_seq(org_id)  # first: every number up to it is committed
    n, prev, last_event, after = 0, GENESIS, 0, 0
    effects: dict[str, EffectRecord | None] = {}
    while True:
        page = await q.list_audit_events(org_id, after, last, _PAGE)
        for seq, event in page:
            if seq <= n:
                check.fail(f"event number {seq} is given to two events", seq)
                continue
            if seq != n + 1:
                check.gap(n + 1, seq)
            n = seq
            record = chain_record(event, n, prev, await _effect(q, effects, event))
            prev, last_event = record["hash"], event.event_id
            check.record(n, prev)
            on_record(record, event)
        if len(page) < _PAGE:
            break
        after = page[-1][0]
    if n < last:
        check.gap(n + 1, last + 1)  # deleted off the end: the counter went further
    check.end(n)
    return n, prev, last_event


@dataclass(frozen=True, slots=True)
class AuditExport:
    """What an export wrote: `written` records chained on `prev`, ending at `head`."""

    org_id: str
    prev: str  # the `prev` of the first written record (GENESIS or an earlier head)
    head: str  # the hash of the chain's last record (stored)
    written: int
    count: int  # records in the whole chain
    diverged_at: int | None = None  # the chain's record that no longer matches
    problem: str | None = None  # why (a gap, an anchor, the stored head)

    @property
    def anchor(self) -> Anchor | None:
        return Anchor(self.count, self.head) if self.count else None


async def export_org(
    store: Store,
    org_id: str,
    write: Callable[[str], object],
    *,
    since_us: int | None = None,
    now_us: int,
    anchors: Iterable[Anchor] = (),
) -> AuditExport:
    """Write the org's audit records as JSON lines (`write` gets each, newline included)
    and store the chain's new head.

    The chain is always rebuilt from its start, so every earlier record is checked again:
    a gap in the org's event sequence, a record that no longer matches the stored head or
    one of `anchors` sets `diverged_at` and `problem`, and the head is not moved. Without
    `since_us` the records after the stored head are written (chained on it); with it, the
    records at or after `since_us`.

    Raises:
        NotFound: no such org.
        InvalidRequest: another export moved the head meanwhile (nothing is stored: run
            the export again).
    """
    async with store.reader() as q:
        if await q.get_org(org_id) is None:
            raise NotFound(f"org '{org_id}' not found")
        stored = await q.get_audit_head(org_id)
        check = _Checker(anchors, stored)
        skip = stored.record_count if stored is not None and since_us is None else 0
        first_prev: str | None = None
        written = 0

        def emit(record: dict[str, Any], event: EventRecord) -> None:
            nonlocal first_prev, written
            if record["n"] <= skip or (since_us is not None and event.created_us < since_us):
                return
            first_prev = record["prev"] if first_prev is None else first_prev
            write(canonical_json(record) + "\n")
            written += 1

        n, head, last_event = await _rebuild(q, org_id, check, emit)
    problem, at = check.problem or (None, None)
    result = AuditExport(org_id, first_prev or head, head, written, n, at, problem)
    if problem is None and (stored is None or n != stored.record_count):
        record = AuditHeadRecord(org_id, head, last_event, n, now_us)
        async with store.transaction() as q:
            if not await q.put_audit_head(record, stored.head_hash if stored else None):
                raise InvalidRequest(_RACED)
    return result


async def verify_org(store: Store, org_id: str, anchors: Iterable[Anchor] = ()) -> ChainCheck:
    """Rebuild the org's chain from the database, from its start, and check it: no gap in
    the event sequence, every anchor matched, and the stored head too.

    Raises:
        NotFound: no such org.
    """
    async with store.reader() as q:
        if await q.get_org(org_id) is None:
            raise NotFound(f"org '{org_id}' not found")
        check = _Checker(anchors, await q.get_audit_head(org_id))
        n, head, _ = await _rebuild(q, org_id, check, lambda record, event: None)
    problem, at = check.problem or (None, None)
    return ChainCheck(org_id, n, head, problem, at)


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
    lines: Iterable[str],
    *,
    prev: str | None = None,
    head: str | None = None,
    anchors: Iterable[Anchor] = (),
) -> Verdict:
    """Check a chain file: every line's hash, every `prev` link and `n` step, the first
    record's `prev` (`prev`, or GENESIS), and, given `head`, the last record's hash (which
    catches lines cut off the end). Each of `anchors` within the file's records must match
    its record, and none may lie beyond the file's last record."""
    expected_prev = prev or GENESIS
    wanted: dict[int, set[str]] = {}
    for anchor in anchors:
        wanted.setdefault(anchor.n, set()).add(anchor.head)
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
        for kept in wanted.get(n, ()):
            if kept != record["hash"]:
                why = f"record {n} does not match the anchor {n}:{kept} (history rewritten?)"
                return Verdict(False, number - 1, expected_prev, number, why)
        last_n, expected_prev = n, record["hash"]
    beyond = [n for n in wanted if last_n is None or n > last_n]
    if beyond:
        why = f"the file ends before record {min(beyond)}, which an anchor names (lines cut off?)"
        return Verdict(False, count, expected_prev, count + 1, why)
    if head is not None and head != expected_prev:
        why = f"the last record's hash is {expected_prev}, not the head {head} (lines cut off?)"
        return Verdict(False, count, expected_prev, count + 1, why)
    return Verdict(True, count, expected_prev)
