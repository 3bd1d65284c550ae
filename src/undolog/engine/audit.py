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

Retention deletes old events; each leaves a mark (migration 25: its number and its record's
hash, computed in the prune's transaction by `pruned_hashes`), which the chain takes in the
event's place: the pruned records are counted, a gap without a mark is still a gap, and a
forged mark of an exported event breaks the chain at the anchor or head that export took.

`export_org` and `verify_org` read the store; the rest is pure.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping
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
    "call_of",
    "chain_record",
    "export_org",
    "iso_us",
    "pruned_hashes",
    "pruned_record",
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


def call_of(effect: EffectRecord) -> dict[str, Any]:
    """The `call` of an audit record that names this effect."""
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
    return _record(event, n, prev, None if effect is None else call_of(effect))


def _record(
    event: EventRecord, n: int, prev: str, call: Mapping[str, Any] | None
) -> dict[str, Any]:
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
    if call is not None:
        record["call"] = dict(call)
    record["hash"] = record_hash(record)
    return record


def pruned_record(n: int, prev: str, hash_: str) -> dict[str, Any]:
    """The line that stands for record `n`, pruned by retention: its place and its hash,
    which `verify_lines` cannot recompute (the content is gone) but chains on."""
    return {"n": n, "prev": prev, "hash": hash_, "pruned": True}


def _is_pruned_record(record: Mapping[str, Any]) -> bool:
    return (
        record.get("pruned") is True
        and set(record) == {"n", "prev", "hash", "pruned"}
        and _is_hash(record["hash"])
    )


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
    pruned: int = 0  # records whose event retention pruned (their marks stood in)

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


async def _walk(
    q: Queries,
    org_id: str,
    start: tuple[int, str],
    last: int,
    check: _Checker,
    on_record: Callable[[dict[str, Any], EventRecord | None], object],
) -> tuple[int, str, int, int]:
    """Walk the org's chain in number order after record `start` (number, hash) up to
    `last`: each event becomes its record; a mark retention left for a pruned event
    (migration 25) stands in for it, its hash carrying the chain on (`on_record` gets
    `pruned_record`, and no event). Returns (last number, its hash, last event id, pruned
    records); gaps go to `check`."""
    n, prev = start
    last_event, pruned = 0, 0
    calls: dict[str, dict[str, Any] | None] = {}
    while True:
        page = await q.list_audit_chain(org_id, n, last, _PAGE)
        for seq, event, pruned_hash in page:
            if seq <= n:
                if event is None and seq == n:
                    continue  # a mark of an event still there: the event is the record
                check.fail(f"event number {seq} is given to two events", seq)
                continue
            if seq != n + 1:
                check.gap(n + 1, seq)
            n = seq
            if event is None:
                assert pruned_hash is not None
                record = pruned_record(n, prev, pruned_hash)
                pruned += 1
            else:
                record = _record(event, n, prev, await _call_of(q, calls, event))
                last_event = event.event_id
            prev = record["hash"]
            check.record(n, prev)
            on_record(record, event)
        if len(page) < _PAGE:
            return n, prev, last_event, pruned


async def _rebuild(
    q: Queries,
    org_id: str,
    check: _Checker,
    on_record: Callable[[dict[str, Any], EventRecord | None], object],
) -> tuple[int, str, int, int]:
    """Rebuild the org's chain from the genesis, every event in sequence order; returns
    (records, head hash, last event id, pruned records). Gaps in the sequence go to
    `check`."""
    last = await q.last_audit_seq(org_id)  # first: every number up to it is committed
    n, prev, last_event, pruned = await _walk(q, org_id, (0, GENESIS), last, check, on_record)
    if n < last:
        check.gap(n + 1, last + 1)  # deleted off the end: the counter went further
    check.end(n)
    return n, prev, last_event, pruned


async def pruned_hashes(q: Queries, org_id: str, seqs: Collection[int]) -> dict[int, str]:
    """The hashes of the audit records of the org's events numbered `seqs` (about to be
    pruned), as every export computes them: the chain is walked from the last mark of a
    pruned event below them (or from the genesis), so a prune reads what lies between, not
    the whole history. Inside the prune's transaction (and its lock: `lock_org_prune`)."""
    if not seqs:
        return {}
    wanted = set(seqs)
    start = await q.last_audit_pruned_below(org_id, min(wanted)) or (0, GENESIS)
    found: dict[int, str] = {}

    def keep(record: dict[str, Any], event: EventRecord | None) -> None:
        if record["n"] in wanted:
            found[record["n"]] = record["hash"]

    await _walk(q, org_id, start, max(wanted), _Checker((), None), keep)
    return found


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
    pruned: int = 0  # records of the chain whose event retention pruned

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

        def emit(record: dict[str, Any], event: EventRecord | None) -> None:
            nonlocal first_prev, written
            if record["n"] <= skip:
                return
            if since_us is not None and (
                first_prev is None if event is None else event.created_us < since_us
            ):
                return  # a pruned record has no time: written once the window has begun
            first_prev = record["prev"] if first_prev is None else first_prev
            write(canonical_json(record) + "\n")
            written += 1

        n, head, last_event, pruned = await _rebuild(q, org_id, check, emit)
    problem, at = check.problem or (None, None)
    result = AuditExport(org_id, first_prev or head, head, written, n, at, problem, pruned)
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
        n, head, _, pruned = await _rebuild(q, org_id, check, lambda record, event: None)
    problem, at = check.problem or (None, None)
    return ChainCheck(org_id, n, head, problem, at, pruned)


async def _call_of(
    q: Queries, cache: dict[str, dict[str, Any] | None], event: EventRecord
) -> dict[str, Any] | None:
    """The `call` of the event's effect: from the effect, or, once retention pruned it,
    from what the prune kept of it (migration 25)."""
    if event.effect_id is None:
        return None
    if event.effect_id not in cache:
        effect = await q.get_effect(event.org_id, event.effect_id)
        if effect is not None:
            cache[event.effect_id] = call_of(effect)
        else:
            kept = await q.get_pruned_call(event.org_id, event.effect_id)
            cache[event.effect_id] = None if kept is None else orjson.loads(kept)
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
    pruned: int = 0  # lines that stand for records retention pruned (`pruned_record`)


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
    its record, and none may lie beyond the file's last record.

    A line `pruned_record` wrote (`"pruned": true` and nothing but `n`, `prev`, `hash`)
    stands for a record whose event retention pruned before the export: its `prev` and `n`
    are checked, its hash cannot be (the content is gone) but the next line must chain on
    it, and anchors must match it; such lines are counted in `pruned`."""
    expected_prev = prev or GENESIS
    wanted: dict[int, set[str]] = {}
    for anchor in anchors:
        wanted.setdefault(anchor.n, set()).add(anchor.head)
    last_n: int | None = None
    count = pruned = 0
    for number, line in enumerate(lines, 1):
        count = number
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return Verdict(False, number - 1, expected_prev, number, "not a JSON record")
        if not isinstance(record, dict) or not isinstance(record.get("hash"), str):
            return Verdict(False, number - 1, expected_prev, number, "not an audit record")
        if _is_pruned_record(record):
            pruned += 1
        elif record_hash(record) != record["hash"]:
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
    return Verdict(True, count, expected_prev, pruned=pruned)
