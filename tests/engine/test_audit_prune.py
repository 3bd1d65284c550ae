"""The audit chain across retention (issue 22, point 7), on both stores.

Retention deletes old events; each goes with a mark in the same transaction (migration 25:
its number and its record's hash), which the chain takes in its place. So an org that
prunes still exports and verifies, the pruned records counted; a deletion with no mark is
still a gap named by its range, and a forged mark of an exported event is found by the
anchor the operator kept. Rows are seeded as the engine leaves them (tests/support/
retention.py) and the pruner's clock is injected, so nothing waits.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import orjson
import pytest

from tests.store.contract_helpers import NOW
from tests.support.retention import add_org, seed
from undolog.engine.audit import Anchor, export_org, verify_lines, verify_org
from undolog.engine.retention import DAY_US, PruneCounts, Retention
from undolog.store import Store

RETENTION_DAYS = 30
LATER = NOW + (RETENTION_DAYS + 1) * DAY_US  # the pruner's now: NOW is past the retention
YOUNG = LATER - DAY_US


@pytest.fixture
async def org(store: Store) -> str:
    org_id = f"org-{uuid.uuid4().hex[:12]}"
    await add_org(store, org_id, RETENTION_DAYS)
    return org_id


async def export(store: Store, org: str, anchors: list[Anchor]) -> tuple[Any, list[str]]:
    """Export the org against `anchors`, keep the new anchor; the result and its lines."""
    lines: list[str] = []
    result = await export_org(
        store, org, lambda line: lines.append(line.rstrip("\n")), now_us=LATER, anchors=anchors
    )
    if result.problem is None and result.anchor is not None:
        anchors.append(result.anchor)
    return result, lines


async def prune(store: Store, org: str, now: int = LATER) -> PruneCounts:
    return (await Retention(store, clock_us=lambda: now).prune(org))[org]


async def sql(store: Store, statement: str, *args: Any) -> None:
    async with store.transaction() as q:
        await q._execute(statement, *args)  # type: ignore[attr-defined]


async def event_ids(store: Store, org: str) -> list[int]:
    async with store.reader() as q:
        return [e.event_id for e in await q.list_events(org)]


async def test_an_org_that_prunes_exports_and_verifies_again(store: Store, org: str) -> None:
    for _ in range(3):  # old and finished: these go
        await seed(store, org, effects=("committed", "committed"))
    young = await seed(store, org, at=YOUNG)
    anchors: list[Anchor] = []
    first, first_lines = await export(store, org, anchors)
    assert (first.problem, first.count) == (None, 7)

    assert await prune(store, org) == PruneCounts(sessions=3, effects=6, events=6)
    async with store.transaction() as q:
        await q.insert_event(org, "session_closed", young.session_id, None, "{}", YOUNG)
    second, second_lines = await export(store, org, anchors)
    checked = await verify_org(store, org, anchors)

    assert (second.problem, second.written, second.count, second.pruned) == (None, 1, 8, 6)
    assert (checked.ok, checked.count, checked.pruned) == (True, 8, 6), checked.problem
    # The kept files still hold the pruned records: one chain, up to the last anchor.
    whole = verify_lines(first_lines + second_lines, anchors=anchors)
    assert (whole.ok, whole.records, whole.head) == (True, 8, second.head), whole.reason


async def test_events_pruned_before_any_export_are_lines_that_keep_the_chain(
    store: Store, org: str
) -> None:
    await seed(store, org, at=YOUNG)
    old = await seed(store, org)  # written after the young one: numbered 2
    await seed(store, org, at=YOUNG)
    assert await prune(store, org) == PruneCounts(sessions=1, effects=1, events=1)
    anchors: list[Anchor] = []
    result, lines = await export(store, org, anchors)
    records = [orjson.loads(line) for line in lines]

    assert (result.problem, result.written, result.pruned) == (None, 3, 1)
    assert records[1] == {"n": 2, "prev": records[0]["hash"], "hash": records[2]["prev"],
                          "pruned": True}  # fmt: skip
    verdict = verify_lines(lines, anchors=anchors)
    assert (verdict.ok, verdict.records, verdict.pruned) == (True, 3, 1), verdict.reason
    assert (await verify_org(store, org, anchors)).ok
    async with store.reader() as q:
        assert await q.get_session(org, old.session_id) is None


async def test_a_kept_event_of_a_pruned_effect_hashes_as_before_until_it_goes_too(
    store: Store, org: str
) -> None:
    """A replay of a pruned session's call, younger than the retention, stays after its
    effect is gone: its record keeps the effect's `call`, so it matches what was exported."""
    done = await seed(store, org)
    async with store.transaction() as q:
        await q.insert_event(
            org, "effect_replayed", done.session_id, done.effect_ids[0], "{}", YOUNG
        )
    anchors: list[Anchor] = []
    before, lines = await export(store, org, anchors)
    assert "call" in orjson.loads(lines[1])

    assert await prune(store, org) == PruneCounts(sessions=1, effects=1, events=1)
    after = await verify_org(store, org, anchors)
    assert (after.ok, after.pruned, after.head) == (True, 1, before.head), after.problem

    much_later = LATER + RETENTION_DAYS * DAY_US
    assert await prune(store, org, much_later) == PruneCounts(events=1)
    gone = await verify_org(store, org, anchors)
    assert (gone.ok, gone.pruned, gone.head) == (True, 2, before.head), gone.problem
    async with store.reader() as q:  # nothing of the effect is kept once its events went
        assert await q.get_pruned_call(org, done.effect_ids[0]) is None


@pytest.mark.security
async def test_a_deletion_by_hand_after_a_prune_is_still_a_gap_with_its_range(
    store: Store, org: str
) -> None:
    await seed(store, org, effects=("committed", "committed"))  # numbered 1, 2: pruned
    await seed(store, org, at=YOUNG, effects=("committed", "committed", "committed"))
    await prune(store, org)
    kept = await event_ids(store, org)
    await sql(store, "DELETE FROM events WHERE event_id IN (?, ?)", kept[0], kept[1])

    result, _ = await export(store, org, [])
    checked = await verify_org(store, org)
    assert result.problem == "events 3..4 are missing from the database (deleted)"
    assert (checked.ok, checked.at, checked.problem) == (False, 3, result.problem)


@pytest.mark.security
async def test_a_forged_mark_of_an_exported_event_fails_against_the_anchor(
    store: Store, org: str
) -> None:
    """Someone with write access deletes an exported event and writes a mark for it, as if
    retention had pruned it: the hash they cannot know without the event's record breaks
    the chain at the anchor. (With the right hash the deletion passes as a prune: the
    event had been exported, and the file still holds it; docs/audit.md.)"""
    await seed(store, org, at=YOUNG, effects=("committed", "committed", "committed"))
    anchors: list[Anchor] = []
    first, lines = await export(store, org, anchors)
    victim = await event_ids(store, org)
    await sql(store, "DELETE FROM events WHERE event_id = ?", victim[1])
    forged = hashlib.sha256(b"not the record").hexdigest()
    await sql(
        store,
        "INSERT INTO audit_pruned_events (org_id, audit_seq, record_hash, pruned_us) "
        "VALUES (?, ?, ?, ?)",
        org, 2, forged, LATER,
    )  # fmt: skip
    await sql(store, "DELETE FROM audit_heads WHERE org_id = ?", org)  # the stored head too

    checked = await verify_org(store, org, anchors)
    again, _ = await export(store, org, anchors)
    assert (checked.ok, checked.at) == (False, 3)
    assert f"no longer matches the anchor {first.anchor}" in (checked.problem or "")
    assert again.diverged_at == 3 and again.problem == checked.problem
    # The kept file is intact, and a forged copy of it fails its own chain.
    assert verify_lines(lines, anchors=anchors).ok
    faked = [*lines]
    faked[1] = orjson.dumps({"n": 2, "prev": orjson.loads(lines[0])["hash"], "hash": forged,
                             "pruned": True}).decode()  # fmt: skip
    assert verify_lines(faked, anchors=anchors).line == 3
