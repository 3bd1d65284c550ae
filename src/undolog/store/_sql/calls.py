"""Shared SQL, part 2: effects, undo entries, approvals, counts and events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from undolog.store._sql.health import HealthSql
from undolog.store._sql.pages import PageSql
from undolog.store._sql.retention import RetentionSql
from undolog.store._sql.rows import (
    APPROVAL,
    APPROVAL_FIELDS,
    EFFECT,
    EFFECT_FIELDS,
    EVENT,
    RUNNING,
    UNDO,
    UNDO_FIELDS,
    UNDO_NEW,
)
from undolog.store._sql.tasks import TaskSql
from undolog.store._sql.webhooks import WebhookSql
from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    Finish,
    UndoEntryRecord,
)
from undolog_sdk.wire import ApprovalStatus, UndoState


class SqlQueries(RetentionSql, HealthSql, WebhookSql, PageSql, TaskSql):
    """All statements of the store, bound to one connection (and maybe one transaction)."""

    # -- effects -----------------------------------------------------------------------------

    async def get_effect(self, org_id: str, effect_id: str) -> EffectRecord | None:
        row = await self._fetchrow(
            f"SELECT {EFFECT.select()} FROM effects WHERE org_id = ? AND effect_id = ?",
            org_id,
            effect_id,
        )
        return EFFECT.row(row) if row else None

    async def get_effect_by_signature(self, org_id: str, signature: str) -> EffectRecord | None:
        row = await self._fetchrow(
            f"SELECT {EFFECT.select()} FROM effects WHERE org_id = ? AND call_signature = ?",
            org_id,
            signature,
        )
        return EFFECT.row(row) if row else None

    async def find_unfinished_call(
        self,
        org_id: str,
        session_id: str,
        tool_name: str,
        args_json: str,
        states: Sequence[str],
        undelivered_states: Sequence[str] = (),
    ) -> EffectRecord | None:
        """The latest effect of this session for the same tool and args whose answer is owed.

        That is one in `states`, or one in `undelivered_states` whose answer has not been
        marked delivered (`mark_delivered`).
        """
        marks = ", ".join("?" for _ in states)
        owed = ""
        if undelivered_states:
            owed_marks = ", ".join("?" for _ in undelivered_states)
            owed = f" OR (delivered_us IS NULL AND state IN ({owed_marks}))"
        row = await self._fetchrow(
            f"SELECT {EFFECT.select()} FROM effects WHERE org_id = ? AND session_id = ? "
            f"AND tool_name = ? AND args = ? AND (state IN ({marks}){owed}) "
            "ORDER BY step_index DESC LIMIT 1",
            org_id,
            session_id,
            tool_name,
            args_json,
            *states,
            *undelivered_states,
        )
        return EFFECT.row(row) if row else None

    async def mark_delivered(
        self, org_id: str, effect_ids: Sequence[str], states: Sequence[str], now_us: int
    ) -> int:
        """Note that these effects' answers reached their client, if they are in `states`."""
        if not effect_ids:
            return 0
        ids = ", ".join("?" for _ in effect_ids)
        marks = ", ".join("?" for _ in states)
        return await self._execute(
            f"UPDATE effects SET delivered_us = ? WHERE org_id = ? AND effect_id IN ({ids}) "
            f"AND state IN ({marks}) AND delivered_us IS NULL",
            now_us,
            org_id,
            *effect_ids,
            *states,
        )

    async def insert_effect(self, effect: EffectRecord) -> bool:
        """Insert an effect unless its signature exists in the org; True when inserted."""
        changed = await self._execute(
            f"{EFFECT.insert('effects')} ON CONFLICT (org_id, call_signature) DO NOTHING",
            *EFFECT.values(effect),
        )
        return changed == 1

    async def insert_executing_effect(
        self,
        effect: EffectRecord,
        undo: UndoEntryRecord | None,
        event_type: str,
        payload_json: str,
    ) -> bool:
        """Insert a new effect with its undo entry (if any) and its event, unless the
        signature exists in the org; True when inserted. Dialects may do it in one statement."""
        if not await self.insert_effect(effect):
            return False
        if undo is not None:
            await self.insert_undo_entry(undo)
        await self.insert_event(
            effect.org_id, event_type, effect.session_id, effect.effect_id, payload_json,
            effect.created_us,
        )  # fmt: skip
        return True

    async def update_effect(
        self, org_id: str, effect_id: str, *, expect_state: str | None = None, **changes: Any
    ) -> bool:
        """Set columns of an effect; with `expect_state`, only if it is still in that state.

        Returns True when a row changed (False means the effect moved on concurrently).
        """
        unknown = set(changes) - EFFECT_FIELDS
        if unknown:
            raise ValueError(f"not updatable effect columns: {sorted(unknown)}")
        sets = ", ".join(f"{name} = ?" for name in changes)
        sql = f"UPDATE effects SET {sets} WHERE org_id = ? AND effect_id = ?"
        args = [*changes.values(), org_id, effect_id]
        if expect_state is not None:
            sql += " AND state = ?"
            args.append(expect_state)
        return await self._execute(sql, *args) == 1

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`finish` (see `Finish`); None when the effect was in none of its `from_states` (or
        does not exist), and then nothing is written. Dialects may do it in one statement."""
        marks = ", ".join("?" for _ in finish.from_states)
        row = await self._fetchrow(
            "UPDATE effects SET state = ?, result = ?, error = ?, lease_expires_us = NULL, "
            "finished_us = ?, updated_us = ?, "
            "delivered_us = CASE WHEN mode = ? THEN ? ELSE delivered_us END "
            "WHERE org_id = ? AND effect_id = ? "
            f"AND state IN ({marks}) RETURNING {EFFECT.select()}",
            finish.target,
            finish.result_json,
            finish.error,
            finish.now_us,
            finish.now_us,
            finish.self_reporting_mode,
            finish.now_us,
            finish.org_id,
            finish.effect_id,
            *finish.from_states,
        )
        if row is None:
            return None
        effect = EFFECT.row(row)
        payload = {
            "stage": finish.target,
            "tool_name": effect.tool_name,
            "attempt": effect.attempts,
        }
        payload.update(finish.extra)
        await self.insert_event(
            finish.org_id, finish.event_type, effect.session_id, finish.effect_id,
            orjson.dumps(payload).decode(), finish.now_us,
        )  # fmt: skip
        return effect

    async def renew_lease(
        self,
        org_id: str,
        effect_id: str,
        attempt: int,
        lease_expires_us: int,
        *,
        running: str = RUNNING,
    ) -> bool:
        """Extend the lease of a run that is still going (the same attempt, still executing).

        One statement and no event: it runs every lease/3 for every call in flight. False when
        the run is over (committed, failed, in doubt) or another attempt took it over.
        """
        changed = await self._execute(
            "UPDATE effects SET lease_expires_us = ? WHERE org_id = ? AND effect_id = ? "
            "AND state = ? AND attempts = ?",
            lease_expires_us,
            org_id,
            effect_id,
            running,
            attempt,
        )
        return changed == 1

    async def claim_expired_effects(
        self, now_us: int, limit: int = 100, *, running: str = RUNNING
    ) -> list[EffectRecord]:
        """Executing effects of every org whose lease has expired (their process died).

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two sweepers never move the same effect.
        """
        rows = await self._fetch(
            f"SELECT {EFFECT.select()} FROM effects WHERE state = ? "
            "AND lease_expires_us <= ? ORDER BY lease_expires_us, effect_id "
            f"LIMIT ?{self._SKIP_LOCKED}",
            running,
            now_us,
            limit,
        )
        return [EFFECT.row(r) for r in rows]

    async def list_effects(self, org_id: str, session_id: str) -> list[EffectRecord]:
        rows = await self._fetch(
            f"SELECT {EFFECT.select()} FROM effects WHERE org_id = ? AND session_id = ? "
            "ORDER BY step_index, created_us",
            org_id,
            session_id,
        )
        return [EFFECT.row(r) for r in rows]

    # -- undo entries ------------------------------------------------------------------------

    async def insert_undo_entry(self, entry: UndoEntryRecord) -> int:
        """Push an entry on its session's undo stack; returns its `seq` (entry.seq is ignored)."""
        row = await self._fetchrow(
            f"{UNDO_NEW.insert('undo_entries')} RETURNING seq",
            *UNDO_NEW.values(entry),
        )
        assert row is not None
        return int(row[0])

    async def get_undo_entry(self, org_id: str, entry_id: str) -> UndoEntryRecord | None:
        row = await self._fetchrow(
            f"SELECT {UNDO.select()} FROM undo_entries WHERE org_id = ? AND entry_id = ?",
            org_id,
            entry_id,
        )
        return UNDO.row(row) if row else None

    async def list_undo_entries(self, org_id: str, session_id: str) -> list[UndoEntryRecord]:
        """A session's undo stack, newest (top) first."""
        rows = await self._fetch(
            f"SELECT {UNDO.select()} FROM undo_entries WHERE org_id = ? AND session_id = ? "
            "ORDER BY seq DESC",
            org_id,
            session_id,
        )
        return [UNDO.row(r) for r in rows]

    async def skip_pending_undo_entries(
        self,
        org_id: str,
        effect_id: str,
        now_us: int,
        *,
        pending: str = UndoState.PENDING.value,
        skipped: str = UndoState.SKIPPED.value,
    ) -> int:
        """Mark an effect's not-yet-run undo entries (`pending`) `skipped` (nothing to undo)."""
        return await self._execute(
            "UPDATE undo_entries SET state = ?, updated_us = ? "
            "WHERE org_id = ? AND effect_id = ? AND state = ?",
            skipped,
            now_us,
            org_id,
            effect_id,
            pending,
        )

    async def update_undo_entry(
        self,
        org_id: str,
        entry_id: str,
        *,
        expect_state: str | None = None,
        expect_claim: str | None = None,
        **changes: Any,
    ) -> bool:
        """Update an entry; `expect_*`: only while it is in that state / held by that claim
        (the SHA-256 hex of the claim token). Answers whether a row changed."""
        unknown = set(changes) - UNDO_FIELDS
        if unknown:
            raise ValueError(f"not updatable undo columns: {sorted(unknown)}")
        sets = ", ".join(f"{name} = ?" for name in changes)
        sql = f"UPDATE undo_entries SET {sets} WHERE org_id = ? AND entry_id = ?"
        args = [*changes.values(), org_id, entry_id]
        if expect_state is not None:
            sql += " AND state = ?"
            args.append(expect_state)
        if expect_claim is not None:
            sql += " AND claim_token_hash = ?"
            args.append(expect_claim)
        return await self._execute(sql, *args) == 1

    # -- approvals ---------------------------------------------------------------------------

    async def insert_approval(self, approval: ApprovalRecord) -> None:
        await self._execute(
            APPROVAL.insert("approvals"),
            *APPROVAL.values(approval),
        )

    async def get_approval(self, org_id: str, approval_id: str) -> ApprovalRecord | None:
        row = await self._fetchrow(
            f"SELECT {APPROVAL.select()} FROM approvals WHERE org_id = ? AND approval_id = ?",
            org_id,
            approval_id,
        )
        return APPROVAL.row(row) if row else None

    async def get_approval_for_effect(self, org_id: str, effect_id: str) -> ApprovalRecord | None:
        row = await self._fetchrow(
            f"SELECT {APPROVAL.select()} FROM approvals WHERE org_id = ? AND effect_id = ?",
            org_id,
            effect_id,
        )
        return APPROVAL.row(row) if row else None

    async def list_approvals(
        self, org_id: str, status: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        """Approvals newest first, the id breaking ties."""
        if status is None:
            rows = await self._fetch(
                f"SELECT {APPROVAL.select()} FROM approvals WHERE org_id = ? "
                "ORDER BY created_us DESC, approval_id DESC LIMIT ?",
                org_id,
                limit,
            )
        else:
            rows = await self._fetch(
                f"SELECT {APPROVAL.select()} FROM approvals WHERE org_id = ? AND status = ? "
                "ORDER BY created_us DESC, approval_id DESC LIMIT ?",
                org_id,
                status,
                limit,
            )
        return [APPROVAL.row(r) for r in rows]

    async def list_session_approvals(self, org_id: str, session_id: str) -> list[ApprovalRecord]:
        rows = await self._fetch(
            f"SELECT {APPROVAL.select()} FROM approvals WHERE org_id = ? AND session_id = ? "
            "ORDER BY created_us, approval_id",
            org_id,
            session_id,
        )
        return [APPROVAL.row(r) for r in rows]

    # Row locks for the sweeper: PostgreSQL skips rows another instance holds; SQLite's
    # single writer already serialises sweepers.
    _SKIP_LOCKED = ""

    async def claim_expired_approvals(
        self, now_us: int, limit: int = 100, *, pending: str = ApprovalStatus.PENDING.value
    ) -> list[ApprovalRecord]:
        """Pending approvals of every org whose timeout has passed, oldest deadline first.

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two instances never sweep the same approval.
        """
        rows = await self._fetch(
            f"SELECT {APPROVAL.select()} FROM approvals WHERE status = ? "
            f"AND timeout_us <= ? ORDER BY timeout_us, approval_id LIMIT ?{self._SKIP_LOCKED}",
            pending,
            now_us,
            limit,
        )
        return [APPROVAL.row(r) for r in rows]

    async def update_approval(
        self, org_id: str, approval_id: str, *, expect_status: str | None = None, **changes: Any
    ) -> bool:
        unknown = set(changes) - APPROVAL_FIELDS
        if unknown:
            raise ValueError(f"not updatable approval columns: {sorted(unknown)}")
        sets = ", ".join(f"{name} = ?" for name in changes)
        sql = f"UPDATE approvals SET {sets} WHERE org_id = ? AND approval_id = ?"
        args = [*changes.values(), org_id, approval_id]
        if expect_status is not None:
            sql += " AND status = ?"
            args.append(expect_status)
        return await self._execute(sql, *args) == 1

    # -- counts (the dashboard's overview) ----------------------------------------------------

    async def count_by_state(self, org_id: str, table: str) -> dict[str, int]:
        """How many rows of an org's `effects`, `sessions` or `approvals` are in each state."""
        column = {"effects": "state", "sessions": "state", "approvals": "status"}[table]
        rows = await self._fetch(
            f"SELECT {column}, COUNT(*) FROM {table} WHERE org_id = ? GROUP BY {column}",
            org_id,
        )
        return {str(r[0]): int(r[1]) for r in rows}

    async def count_events(self, org_id: str, type_: str) -> int:
        """How many events of one type an org has (e.g. `effect_replayed`: replays)."""
        row = await self._fetchrow(
            "SELECT COUNT(*) FROM events WHERE org_id = ? AND type = ?", org_id, type_
        )
        return int(row[0]) if row else 0

    # -- events ------------------------------------------------------------------------------

    async def insert_event(
        self,
        org_id: str,
        type_: str,
        session_id: str | None,
        effect_id: str | None,
        payload_json: str,
        now_us: int,
    ) -> int:
        self.events_written = True
        row = await self._fetchrow(
            "INSERT INTO events (org_id, type, session_id, effect_id, payload, created_us) "
            "VALUES (?, ?, ?, ?, ?, ?) RETURNING event_id",
            org_id,
            type_,
            session_id,
            effect_id,
            payload_json,
            now_us,
        )
        assert row is not None
        return int(row[0])

    async def list_events_since(
        self, after_id: int, limit: int, *, newest: bool = False
    ) -> list[EventRecord]:
        """Events of every org above `after_id`, oldest first (or just the newest ones)."""
        order = "DESC" if newest else "ASC"
        rows = await self._fetch(
            f"SELECT {EVENT.select()} FROM events WHERE event_id > ? "
            f"ORDER BY event_id {order} LIMIT ?",
            after_id,
            limit,
        )
        return [EVENT.row(r) for r in rows]

    async def list_event_ids_since(self, after_id: int, limit: int) -> list[int]:
        """The ids of the events of every org above `after_id`, oldest first: what the event
        broker reads to keep its high-water mark while nobody listens (no payloads)."""
        rows = await self._fetch(
            "SELECT event_id FROM events WHERE event_id > ? ORDER BY event_id LIMIT ?",
            after_id,
            limit,
        )
        return [int(row[0]) for row in rows]

    async def list_events(
        self,
        org_id: str,
        after_id: int = 0,
        limit: int = 1000,
        session_id: str | None = None,
    ) -> list[EventRecord]:
        """Events of an org with an id above `after_id`, oldest first."""
        if session_id is None:
            rows = await self._fetch(
                f"SELECT {EVENT.select()} FROM events WHERE org_id = ? AND event_id > ? "
                "ORDER BY event_id LIMIT ?",
                org_id,
                after_id,
                limit,
            )
        else:
            rows = await self._fetch(
                f"SELECT {EVENT.select()} FROM events WHERE org_id = ? AND event_id > ? "
                "AND session_id = ? ORDER BY event_id LIMIT ?",
                org_id,
                after_id,
                session_id,
                limit,
            )
        return [EVENT.row(r) for r in rows]
