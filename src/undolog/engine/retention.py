"""Retention: pruning the finished sessions an org no longer keeps (docs/retention.md).

The rule is stated here, as data (`PruneRule`), and applied by the store in SQL. A session
may go once it is over and its org's `retention_days` have passed since its last update:

- completed or compensated (no move leaves those states), or failed / halted with nothing
  left to unwind (no undo entry pending, running or failed);
- and none of its effects is pending, executing, awaiting approval, in doubt, compensating or
  failed to compensate, or was updated within the retention; no undo entry is running; no
  approval is pending.

It goes with its effects, undo entries and approvals, one batch of sessions per transaction,
so a call waits for one short batch at most. On SQLite the prune pauses between batches
(`SQLITE_PAUSE_SECONDS`): a writer of another process (the server, while `undolog prune`
runs) waits for the lock by polling, up to every 100 ms, and would otherwise keep missing the
short gaps between batches. Events go afterwards, walked in id order: an
event older than the retention goes when its session is gone (or it has none), leaving a mark
for the audit chain in the same transaction (the hash of its record; docs/audit.md,
"Retention"); a batch of sessions keeps its effects' audit `call` until their events are gone.

MCP tasks (migration 19) are not kept by retention but by their own `ttl`: `expire_tasks`
deletes every org's expired task rows, a batch at a time, in the same sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from undolog.engine.audit import call_of, pruned_hashes
from undolog.engine.model import now_us
from undolog.engine.states import ApprovalStatus, EffectState, SessionState, UndoState
from undolog.store.protocol import Store
from undolog_sdk.signature import canonical_json

__all__ = [
    "DAY_US",
    "DEFAULT_BATCH_SIZE",
    "MAX_BATCH_SIZE",
    "PRUNE_RULE",
    "SQLITE_PAUSE_SECONDS",
    "PruneCounts",
    "PruneRule",
    "Retention",
    "cutoff_us",
]

# Longer than SQLite's longest wait between two tries for a lock (its busy handler sleeps 1,
# 2, 5, ... up to 100 ms): a writer of another process polls at least once in each pause.
SQLITE_PAUSE_SECONDS = 0.12

DEFAULT_BATCH_SIZE = 200
MAX_BATCH_SIZE = 10_000  # an IN list of this many ids is still one cheap statement
DAY_US = 86_400 * 1_000_000
# Events are walked in chunks of this many per session of a batch: a session has several.
EVENTS_PER_SESSION = 10


@dataclass(frozen=True)
class PruneRule:
    """Which sessions may be pruned and which of their rows' states keep them."""

    done: tuple[str, ...]  # the session is over
    unwound_only: tuple[str, ...]  # over once no undo entry is in `unwind_undo`
    busy_effects: tuple[str, ...]  # an effect in one of these keeps its session
    busy_undo: tuple[str, ...]  # an undo entry in one of these keeps its session
    unwind_undo: tuple[str, ...]  # still to unwind, for the `unwound_only` sessions
    open_approvals: tuple[str, ...]  # an approval in one of these keeps its session


PRUNE_RULE = PruneRule(
    done=(SessionState.COMPLETED.value, SessionState.COMPENSATED.value),
    unwound_only=(SessionState.FAILED.value, SessionState.HALTED.value),
    busy_effects=tuple(
        s.value
        for s in (
            EffectState.PENDING,
            EffectState.EXECUTING,
            EffectState.AWAITING_APPROVAL,
            EffectState.IN_DOUBT,
            EffectState.COMPENSATING,
            EffectState.COMPENSATION_FAILED,
        )
    ),
    busy_undo=(UndoState.RUNNING.value,),
    unwind_undo=(UndoState.PENDING.value, UndoState.RUNNING.value, UndoState.FAILED.value),
    open_approvals=(ApprovalStatus.PENDING.value,),
)


@dataclass(frozen=True)
class PruneCounts:
    """Rows pruned (or, in a dry run, that would be) per table."""

    sessions: int = 0
    effects: int = 0
    undo_entries: int = 0
    approvals: int = 0
    events: int = 0

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(PruneCounts))
        )

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(PruneCounts)}

    @classmethod
    def from_tables(cls, counts: dict[str, int], events: int = 0) -> PruneCounts:
        return cls(
            sessions=counts.get("sessions", 0),
            effects=counts.get("effects", 0),
            undo_entries=counts.get("undo_entries", 0),
            approvals=counts.get("approvals", 0),
            events=events,
        )


def cutoff_us(now: int, retention_days: int) -> int:
    """The time before which a finished session (and an event) is past its retention."""
    return now - retention_days * DAY_US


class Retention:
    """Prunes what orgs' retention lets go, in short batches (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        rule: PruneRule = PRUNE_RULE,
        clock_us: Callable[[], int] = now_us,
        pause_seconds: float | None = None,
    ) -> None:
        self.store = store
        self.rule = rule
        self._clock = clock_us
        # Between two batches (None: SQLITE_PAUSE_SECONDS on SQLite, none on PostgreSQL,
        # whose writers queue on row locks and need no gap to get in).
        if pause_seconds is None:
            pause_seconds = SQLITE_PAUSE_SECONDS if store.dialect == "sqlite" else 0.0
        self.pause_seconds = pause_seconds

    async def policies(self, org_id: str | None = None) -> list[tuple[str, int]]:
        """(org id, retention days) of the orgs that do not keep everything (or of `org_id`
        only: empty if it keeps everything or does not exist)."""
        async with self.store.reader() as q:
            found = await q.orgs_with_retention()
        return [p for p in found if org_id is None or p[0] == org_id]

    async def prune(
        self,
        org_id: str | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        days: dict[str, int] | None = None,
        on_batch: Callable[[str, PruneCounts], None] | None = None,
    ) -> dict[str, PruneCounts]:
        """Prune every org with a retention (or `org_id` only); what went, per org.

        `days` overrides the stored retention of the orgs it names (the CLI's config file).
        `on_batch` hears each committed batch (metrics). A dry run writes nothing and counts
        what a prune would delete now.
        """
        policies = dict(await self.policies())
        policies.update(days or {})
        if org_id is not None:
            policies = {org_id: policies[org_id]} if org_id in policies else {}
        report = {}
        for org, retention_days in sorted(policies.items()):
            report[org] = await self.prune_org(
                org, retention_days, batch_size=batch_size, dry_run=dry_run, on_batch=on_batch
            )
        return report

    async def expire_tasks(self, *, batch_size: int = DEFAULT_BATCH_SIZE) -> int:
        """Delete every org's MCP task rows whose ttl has passed, a batch per transaction
        (an org's own go also as it creates a task); how many went."""
        now = self._clock()
        total = 0
        while True:
            async with self.store.transaction() as q:
                gone = await q.delete_expired_mcp_tasks(None, now, batch_size)
            total += gone
            if gone < batch_size:
                return total
            await asyncio.sleep(self.pause_seconds)  # let waiting calls in first

    async def prune_org(
        self,
        org_id: str,
        retention_days: int,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        dry_run: bool = False,
        on_batch: Callable[[str, PruneCounts], None] | None = None,
    ) -> PruneCounts:
        """Prune one org's sessions past `retention_days`, then their events.

        Each batch of `batch_size` sessions is its own transaction; between batches other
        work gets the store (and the event loop) first.
        """
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"batch size must be between 1 and {MAX_BATCH_SIZE}")
        cutoff = cutoff_us(self._clock(), retention_days)
        total = PruneCounts()
        gone: set[str] = set()  # a dry run's sessions, which its event walk counts as gone
        after: tuple[int, str] = (-1, "")
        while True:
            batch = await self._session_batch(org_id, cutoff, after, batch_size, dry_run)
            if batch is None:
                break
            counts, after, ids = batch
            if dry_run:
                gone.update(ids)
            elif on_batch is not None:
                on_batch(org_id, counts)
            total += counts
            await asyncio.sleep(self.pause_seconds)  # let waiting calls in first
        events, walked = await self._prune_events(
            org_id, cutoff, batch_size * EVENTS_PER_SESSION, dry_run, gone, on_batch
        )
        if walked and not dry_run:
            # Every event older than the cutoff whose session is gone went: none is left of
            # an effect pruned before it, so the calls kept for their records can go.
            async with self.store.transaction() as q:
                if await q.lock_org_prune(org_id):
                    await q.delete_pruned_calls(org_id, cutoff)
        return total + PruneCounts(events=events)

    async def _session_batch(
        self, org_id: str, cutoff: int, after: tuple[int, str], limit: int, dry_run: bool
    ) -> tuple[PruneCounts, tuple[int, str], Sequence[str]] | None:
        rule = self.rule
        unit = self.store.reader() if dry_run else self.store.transaction()
        async with unit as q:
            found = await q.prunable_sessions(
                org_id,
                cutoff,
                after,
                limit,
                done=rule.done,
                unwound_only=rule.unwound_only,
                busy_effects=rule.busy_effects,
                busy_undo=rule.busy_undo,
                unwind_undo=rule.unwind_undo,
                open_approvals=rule.open_approvals,
            )
            if not found:
                return None
            ids = [session_id for session_id, _ in found]
            if dry_run:
                counts = await q.count_session_rows(org_id, ids)
            else:
                # The audit chain's records of these effects' events keep their `call`.
                calls = [
                    (e.effect_id, canonical_json(call_of(e)))
                    for e in await q.session_effects(org_id, ids)
                ]
                await q.put_pruned_calls(org_id, calls, self._clock())
                counts = await q.delete_sessions(org_id, ids)
        last_id, last_us = found[-1]
        return PruneCounts.from_tables(counts), (last_us, last_id), ids

    async def _prune_events(
        self,
        org_id: str,
        cutoff: int,
        limit: int,
        dry_run: bool,
        gone: set[str],
        on_batch: Callable[[str, PruneCounts], None] | None,
    ) -> tuple[int, bool]:
        """Walk the org's events oldest first, up to the first one younger than the cutoff;
        delete those whose session is gone (or that have none), each with its mark for the
        audit chain (the hash of its record, migration 25), in the same transaction.
        Returns how many, and whether the walk went all the way. Two pruners of one org may
        walk at once: each chunk's deletes and marks are written under the org's prune lock
        (waited for), and an event the other pruner deleted first is not counted twice."""
        pruned = 0
        after_id = 0
        while True:
            async with self.store.reader() as q:
                chunk = await q.event_chunk(org_id, after_id, limit)
                old = [e for e in chunk if e[1] < cutoff]
                named = sorted({e[2] for e in old if e[2] is not None})
                kept = await q.existing_sessions(org_id, named) - gone
            going = [(e[0], e[3]) for e in old if e[2] not in kept]
            if going and not dry_run:
                async with self.store.transaction() as q:
                    # Waits for another pruner's chunk rather than leaving these events to it:
                    # its walk may have gone past them while their sessions still stood.
                    await q.lock_org_prune(org_id, wait=True)
                    hashes = await pruned_hashes(q, org_id, [seq for _, seq in going])
                    went = await q.delete_events(org_id, [i for i, _ in going], cutoff)
                    await q.put_audit_pruned(
                        org_id, [(seq, hashes[seq]) for seq in went], self._clock()
                    )
                if on_batch is not None:
                    on_batch(org_id, PruneCounts(events=len(went)))
                pruned += len(went)
            else:
                pruned += len(going)
            if len(old) < len(chunk) or len(chunk) < limit:
                return pruned, True  # reached the young events, or the end
            after_id = chunk[-1][0]
            await asyncio.sleep(self.pause_seconds)
