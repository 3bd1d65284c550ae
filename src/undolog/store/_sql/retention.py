"""Shared SQL, part 3: the statements of pruning (docs/retention.md).

Every statement is bounded (a `LIMIT`, or an explicit list of ids) so that a caller can keep
its transactions short. Which states a prunable session may hold, and which states of its
rows keep it, are parameters without defaults: the store applies the rule, the engine
(`engine/retention.py` `PRUNE_RULE`) states it.
"""

from __future__ import annotations

from collections.abc import Sequence

from undolog.store._sql.accounts import AccountSql
from undolog.store._sql.rows import EFFECT
from undolog.store.records import EffectRecord

_ROWS_PER_INSERT = 500  # 4 values a row: well under either dialect's bound on parameters

# The rows hanging off a batch of sessions, in the order they are deleted (children first:
# undo entries and approvals reference effects).
_SESSION_ROWS = (
    (
        "approvals",
        "effect_id IN (SELECT effect_id FROM effects WHERE org_id = ? AND session_id IN ({ids}))",
    ),
    ("undo_entries", "session_id IN ({ids})"),
    ("effects", "session_id IN ({ids})"),
    ("sessions", "session_id IN ({ids})"),
)


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


class RetentionSql(AccountSql):
    """Finding and deleting what an org's retention lets go."""

    # PostgreSQL: " FOR UPDATE OF s SKIP LOCKED" (two pruners never take the same sessions,
    # and a session is not changed under a batch that is deleting it).
    _SKIP_LOCKED_SESSIONS = ""

    async def orgs_with_retention(self) -> list[tuple[str, int]]:
        """(org id, retention days) of every org that does not keep everything."""
        rows = await self._fetch(
            "SELECT org_id, retention_days FROM orgs WHERE retention_days IS NOT NULL "
            "ORDER BY org_id"
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    async def prunable_sessions(
        self,
        org_id: str,
        cutoff_us: int,
        after: tuple[int, str],
        limit: int,
        *,
        done: Sequence[str],
        unwound_only: Sequence[str],
        busy_effects: Sequence[str],
        busy_undo: Sequence[str],
        unwind_undo: Sequence[str],
        open_approvals: Sequence[str],
    ) -> list[tuple[str, int]]:
        """Up to `limit` sessions of the org that may be pruned, oldest update first, after
        the (updated_us, session_id) cursor `after`: (session id, updated_us).

        A session qualifies when it was last updated before `cutoff_us`, is in a `done`
        state, or in an `unwound_only` state with no undo entry in `unwind_undo`, and has no
        effect in `busy_effects` nor updated since the cutoff, no undo entry in `busy_undo`
        and no approval in `open_approvals`. On PostgreSQL inside a transaction the rows
        stay locked until it ends.
        """
        states = (*done, *unwound_only)
        rows = await self._fetch(
            "SELECT s.session_id, s.updated_us FROM sessions s "
            "WHERE s.org_id = ? AND s.updated_us < ? AND s.updated_us >= ? "
            "AND (s.updated_us > ? OR s.session_id > ?) "
            f"AND s.state IN ({_marks(states)}) "
            "AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.org_id = s.org_id "
            "AND e.session_id = s.session_id "
            f"AND (e.state IN ({_marks(busy_effects)}) OR e.updated_us >= ?)) "
            "AND NOT EXISTS (SELECT 1 FROM undo_entries u WHERE u.org_id = s.org_id "
            f"AND u.session_id = s.session_id AND (u.state IN ({_marks(busy_undo)}) "
            f"OR (s.state IN ({_marks(unwound_only)}) "
            f"AND u.state IN ({_marks(unwind_undo)})))) "
            "AND NOT EXISTS (SELECT 1 FROM approvals a WHERE a.org_id = s.org_id "
            f"AND a.status IN ({_marks(open_approvals)}) AND a.session_id = s.session_id) "
            f"ORDER BY s.updated_us, s.session_id LIMIT ?{self._SKIP_LOCKED_SESSIONS}",
            org_id,
            cutoff_us,
            after[0],  # a bound the index range starts at: earlier sessions are not read
            after[0],
            after[1],
            *states,
            *busy_effects,
            cutoff_us,
            *busy_undo,
            *unwound_only,
            *unwind_undo,
            *open_approvals,
            limit,
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    async def count_session_rows(self, org_id: str, session_ids: Sequence[str]) -> dict[str, int]:
        """How many rows of each table hang off these sessions (the sessions included)."""
        counts: dict[str, int] = {}
        if not session_ids:
            return {table: 0 for table, _ in _SESSION_ROWS}
        for table, where in _SESSION_ROWS:
            row = await self._fetchrow(
                f"SELECT COUNT(*) FROM {table} WHERE org_id = ? AND "
                + where.format(ids=_marks(session_ids)),
                *self._session_args(table, org_id, session_ids),
            )
            counts[table] = int(row[0]) if row else 0
        return counts

    async def delete_sessions(self, org_id: str, session_ids: Sequence[str]) -> dict[str, int]:
        """Delete these sessions with their effects, undo entries and approvals (not their
        events: see `delete_events`). Returns how many rows of each table went."""
        counts: dict[str, int] = {}
        for table, where in _SESSION_ROWS:
            counts[table] = (
                await self._execute(
                    f"DELETE FROM {table} WHERE org_id = ? AND "
                    + where.format(ids=_marks(session_ids)),
                    *self._session_args(table, org_id, session_ids),
                )
                if session_ids
                else 0
            )
        return counts

    @staticmethod
    def _session_args(table: str, org_id: str, session_ids: Sequence[str]) -> list[str]:
        if table == "approvals":  # the subquery names the org again
            return [org_id, org_id, *session_ids]
        return [org_id, *session_ids]

    async def event_chunk(
        self, org_id: str, after_id: int, limit: int
    ) -> list[tuple[int, int, str | None, int]]:
        """The org's next `limit` events above `after_id`, oldest first:
        (event id, created_us, session id, number in the org's sequence)."""
        rows = await self._fetch(
            "SELECT event_id, created_us, session_id, audit_seq FROM events "
            "WHERE org_id = ? AND event_id > ? ORDER BY event_id LIMIT ?",
            org_id,
            after_id,
            limit,
        )
        return [
            (int(r[0]), int(r[1]), None if r[2] is None else str(r[2]), int(r[3])) for r in rows
        ]

    async def existing_sessions(self, org_id: str, session_ids: Sequence[str]) -> set[str]:
        """Which of these sessions the org still has."""
        if not session_ids:
            return set()
        rows = await self._fetch(
            f"SELECT session_id FROM sessions WHERE org_id = ? "
            f"AND session_id IN ({_marks(session_ids)})",
            org_id,
            *session_ids,
        )
        return {str(r[0]) for r in rows}

    async def delete_events(
        self, org_id: str, event_ids: Sequence[int], cutoff_us: int
    ) -> list[int]:
        """Delete these events if they are older than `cutoff_us` and their session is gone
        (or they have none): checked again here, so a session created meanwhile keeps its
        events. Returns the numbers (`audit_seq`) of those that went."""
        if not event_ids:
            return []
        rows = await self._fetch(
            f"DELETE FROM events WHERE org_id = ? AND event_id IN ({_marks(event_ids)}) "
            "AND created_us < ? AND (session_id IS NULL OR NOT EXISTS (SELECT 1 FROM "
            "sessions s WHERE s.org_id = events.org_id AND s.session_id = events.session_id)) "
            "RETURNING audit_seq",
            org_id,
            *event_ids,
            cutoff_us,
        )
        return [int(r[0]) for r in rows]

    # -- what the audit chain keeps of what was pruned (migration 25) -------------------------

    async def lock_org_prune(self, org_id: str, *, wait: bool = False) -> bool:
        """Take the org's prune lock for this transaction: if free, or once the pruner holding
        it commits (`wait`); False when another pruner holds it and `wait` is off. SQLite has
        one writer: always True."""
        return True

    async def put_audit_pruned(
        self, org_id: str, marks: Sequence[tuple[int, str]], now_us: int
    ) -> None:
        """Record pruned events: (number, the hash of its audit record)."""
        for start in range(0, len(marks), _ROWS_PER_INSERT):
            part = marks[start : start + _ROWS_PER_INSERT]
            await self._execute(
                "INSERT INTO audit_pruned_events (org_id, audit_seq, record_hash, pruned_us) "
                "VALUES " + ", ".join("(?, ?, ?, ?)" for _ in part),
                *(v for seq, hash_ in part for v in (org_id, seq, hash_, now_us)),
            )

    async def session_effects(self, org_id: str, session_ids: Sequence[str]) -> list[EffectRecord]:
        """The effects of these sessions."""
        if not session_ids:
            return []
        rows = await self._fetch(
            f"SELECT {EFFECT.select()} FROM effects WHERE org_id = ? "
            f"AND session_id IN ({_marks(session_ids)})",
            org_id,
            *session_ids,
        )
        return [EFFECT.row(r) for r in rows]

    async def put_pruned_calls(
        self, org_id: str, calls: Sequence[tuple[str, str]], now_us: int
    ) -> None:
        """Keep the `call` (canonical JSON) of pruned effects: (effect id, call)."""
        for start in range(0, len(calls), _ROWS_PER_INSERT):
            part = calls[start : start + _ROWS_PER_INSERT]
            await self._execute(
                "INSERT INTO audit_pruned_calls (org_id, effect_id, call_json, pruned_us) "
                "VALUES "
                + ", ".join("(?, ?, ?, ?)" for _ in part)
                + " ON CONFLICT (org_id, effect_id) DO NOTHING",
                *(v for effect_id, call in part for v in (org_id, effect_id, call, now_us)),
            )

    async def delete_pruned_calls(self, org_id: str, before_us: int) -> int:
        """Forget the calls of effects pruned at or before `before_us`; how many went."""
        return await self._execute(
            "DELETE FROM audit_pruned_calls WHERE org_id = ? AND pruned_us <= ?",
            org_id,
            before_us,
        )
