"""The store: every read and write UndoLog makes, on top of three dialect primitives.

`Queries` holds all the SQL (written with `?` placeholders) and turns rows into records;
a dialect supplies `_fetchrow`, `_fetch` and `_execute` and whatever else differs (the
advisory lock, the placeholder style). `Store` hands out `Queries` bound to a transaction
(`transaction()`) or to an autocommit connection (`reader()`). The store knows nothing of
the engine: it checks no state machine, it only reads and writes rows.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from importlib import resources
from typing import Any, ClassVar, Literal

import orjson

from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    KeyRecord,
    OrgRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)

__all__ = ["EFFECT_COLUMNS", "ExecuteNew", "Queries", "Store", "load_migrations"]

# What `Store.execute_new` did: wrote the new call, or replayed it, or found its signature
# taken, its lock busy or its session not active (the engine takes its full path).
# "forbidden": the session is another key's and the caller may use only its own.
ExecuteNew = Literal["inserted", "replayed", "exists", "busy", "closed", "forbidden"]

EFFECT_COLUMNS = (
    "effect_id, org_id, session_id, step_index, tool_name, tool_version, tier, call_signature, "
    "args, state, mode, attempts, result, error, lease_expires_us, executed_us, finished_us, "
    "created_us, updated_us"
)
_UNDO_COLUMNS = (
    "seq, entry_id, org_id, session_id, effect_id, fn_name, fn_version, args, max_retries, "
    "retry_backoff_ms, registered_us, state, attempts, last_error, updated_us, runner, "
    "lease_expires_us, claim_token_hash"
)
_APPROVAL_COLUMNS = (
    "approval_id, org_id, effect_id, session_id, tool_name, args, status, created_us, "
    "timeout_us, decided_us, decided_by, reason"
)
_TOOL_COLUMNS = (
    "org_id, name, tier, version, compensation, idempotent_upstream, upstream, updated_us"
)
_KEY_COLUMNS = "key_id, key_hash, org_id, name, role, source, created_us, last_used_us, revoked_us"
_ORG_COLUMNS = "org_id, name, approval_timeout_s, auto_approve_on_timeout, created_us"
_SESSION_COLUMNS = "org_id, session_id, state, last_step, created_us, updated_us, owner_key_id"
# What an id can name, for `Queries.session_owner`: its table and id column.
_OWNED_BY_SESSION = {
    "session": ("sessions", "session_id"),
    "effect": ("effects", "effect_id"),
    "approval": ("approvals", "approval_id"),
    "undo_entry": ("undo_entries", "entry_id"),
}
_EVENT_COLUMNS = "event_id, org_id, type, session_id, effect_id, payload, created_us"

_EFFECT_FIELDS = frozenset(
    {
        "state",
        "attempts",
        "result",
        "error",
        "lease_expires_us",
        "executed_us",
        "finished_us",
        "updated_us",
    }
)
_UNDO_FIELDS = frozenset(
    {
        "state",
        "attempts",
        "last_error",
        "updated_us",
        "registered_us",
        "lease_expires_us",
        "claim_token_hash",
    }
)
_APPROVAL_FIELDS = frozenset({"status", "decided_us", "decided_by", "reason", "timeout_us"})


def _effect(row: Sequence[Any]) -> EffectRecord:
    return EffectRecord(*row)


def _undo(row: Sequence[Any]) -> UndoEntryRecord:
    return UndoEntryRecord(*row)


def _approval(row: Sequence[Any]) -> ApprovalRecord:
    return ApprovalRecord(*row)


def _tool(row: Sequence[Any]) -> ToolRecord:
    return ToolRecord(row[0], row[1], row[2], row[3], row[4], bool(row[5]), row[6], row[7])


def _org(row: Sequence[Any]) -> OrgRecord:
    return OrgRecord(row[0], row[1], row[2], bool(row[3]), row[4])


def _session(row: Sequence[Any]) -> SessionRecord:
    return SessionRecord(*row)


def _event(row: Sequence[Any]) -> EventRecord:
    return EventRecord(*row)


class Queries(abc.ABC):
    """All statements of the store, bound to one connection (and maybe one transaction)."""

    # Set once an event row is written: the store tells its event listeners after commit.
    events_written = False

    # -- dialect primitives ------------------------------------------------------------------

    @abc.abstractmethod
    async def _fetchrow(self, sql: str, *args: Any) -> Sequence[Any] | None: ...

    @abc.abstractmethod
    async def _fetch(self, sql: str, *args: Any) -> list[Sequence[Any]]: ...

    @abc.abstractmethod
    async def _execute(self, sql: str, *args: Any) -> int:
        """Run a statement; return the number of rows it changed."""

    # -- orgs and keys -----------------------------------------------------------------------

    async def upsert_org(
        self, org_id: str, name: str, approval_timeout_s: int, auto_approve: bool, now_us: int
    ) -> None:
        await self._execute(
            "INSERT INTO orgs (org_id, name, approval_timeout_s, auto_approve_on_timeout, "
            "created_us) VALUES (?, ?, ?, ?, ?) ON CONFLICT (org_id) DO UPDATE SET "
            "name = excluded.name, approval_timeout_s = excluded.approval_timeout_s, "
            "auto_approve_on_timeout = excluded.auto_approve_on_timeout",
            org_id,
            name,
            approval_timeout_s,
            auto_approve,
            now_us,
        )

    async def get_org(self, org_id: str) -> OrgRecord | None:
        row = await self._fetchrow(f"SELECT {_ORG_COLUMNS} FROM orgs WHERE org_id = ?", org_id)
        return _org(row) if row else None

    async def put_api_key(self, key: KeyRecord) -> KeyRecord:
        """Store a key, or give a stored one (same hash) this org, name, role and source.

        A key listed again is live again (`revoked_us` cleared) and keeps its `key_id`:
        the config is the source of truth for the keys it names. Returns the stored row.
        """
        await self._execute(
            f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key_hash) DO UPDATE SET org_id = excluded.org_id, "
            "name = excluded.name, role = excluded.role, source = excluded.source, "
            "revoked_us = NULL",
            key.key_id,
            key.key_hash,
            key.org_id,
            key.name,
            key.role,
            key.source,
            key.created_us,
            key.last_used_us,
            key.revoked_us,
        )
        row = await self._fetchrow(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE key_hash = ?", key.key_hash
        )
        assert row is not None
        return KeyRecord(*row)

    async def revoke_unlisted_keys(
        self, source: str, keep_hashes: Collection[str], now_us: int, org_id: str | None = None
    ) -> int:
        """Revoke the live keys of `source` (and of `org_id`, if given) not in `keep_hashes`;
        end their dashboard sessions. Returns how many keys were revoked."""
        keep = sorted(keep_hashes)
        where = "source = ? AND revoked_us IS NULL"
        args: list[Any] = [source]
        if org_id is not None:
            where += " AND org_id = ?"
            args.append(org_id)
        if keep:
            where += f" AND key_hash NOT IN ({', '.join('?' for _ in keep)})"
            args += keep
        # Set-based, two statements whatever the number of keys: a start stays quick.
        await self._execute(
            "UPDATE ui_sessions SET ended_us = ? WHERE ended_us IS NULL AND key_id IN "
            f"(SELECT key_id FROM api_keys WHERE {where})",
            now_us,
            *args,
        )
        return await self._execute(
            f"UPDATE api_keys SET revoked_us = ? WHERE {where}", now_us, *args
        )

    async def revoke_key(self, key_id: str, now_us: int) -> bool:
        """Revoke a key and end its dashboard sessions; False if no live key has this id."""
        changed = await self._execute(
            "UPDATE api_keys SET revoked_us = ? WHERE key_id = ? AND revoked_us IS NULL",
            now_us,
            key_id,
        )
        await self._execute(
            "UPDATE ui_sessions SET ended_us = ? WHERE key_id = ? AND ended_us IS NULL",
            now_us,
            key_id,
        )
        return changed > 0

    async def live_key(self, key_hash: str) -> KeyRecord | None:
        """The unrevoked key with this hash."""
        row = await self._fetchrow(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE key_hash = ? AND revoked_us IS NULL",
            key_hash,
        )
        return KeyRecord(*row) if row else None

    async def list_keys(self, org_id: str | None = None) -> list[KeyRecord]:
        if org_id is None:
            rows = await self._fetch(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_us")
        else:
            rows = await self._fetch(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE org_id = ? ORDER BY created_us",
                org_id,
            )
        return [KeyRecord(*row) for row in rows]

    async def touch_key(self, key_id: str, now_us: int) -> None:
        await self._execute("UPDATE api_keys SET last_used_us = ? WHERE key_id = ?", now_us, key_id)

    async def ensure_org_exists(self, org_id: str, now_us: int) -> None:
        """Create a bare org if there is none (an existing one is left as it is)."""
        await self._execute(
            "INSERT INTO orgs (org_id, name, approval_timeout_s, auto_approve_on_timeout, "
            "created_us) VALUES (?, ?, 3600, ?, ?) ON CONFLICT (org_id) DO NOTHING",
            org_id,
            org_id,
            False,
            now_us,
        )

    # -- dashboard sessions ------------------------------------------------------------------

    async def insert_ui_session(
        self, session_hash: str, key_id: str, org_id: str, now_us: int, expires_us: int
    ) -> None:
        await self._execute(
            "INSERT INTO ui_sessions (session_hash, key_id, org_id, created_us, expires_us) "
            "VALUES (?, ?, ?, ?, ?)",
            session_hash,
            key_id,
            org_id,
            now_us,
            expires_us,
        )

    async def ui_session_key(self, session_hash: str, now_us: int) -> KeyRecord | None:
        """The live key behind a live dashboard session (not ended, not expired)."""
        columns = ", ".join(f"k.{c.strip()}" for c in _KEY_COLUMNS.split(","))
        row = await self._fetchrow(
            f"SELECT {columns} FROM ui_sessions s JOIN api_keys k ON k.key_id = s.key_id "
            "WHERE s.session_hash = ? AND s.ended_us IS NULL AND s.expires_us > ? "
            "AND k.revoked_us IS NULL AND k.org_id = s.org_id",
            session_hash,
            now_us,
        )
        return KeyRecord(*row) if row else None

    async def end_ui_session(self, session_hash: str, now_us: int) -> None:
        await self._execute(
            "UPDATE ui_sessions SET ended_us = ? WHERE session_hash = ? AND ended_us IS NULL",
            now_us,
            session_hash,
        )

    # -- tools -------------------------------------------------------------------------------

    async def upsert_tool(self, tool: ToolRecord) -> None:
        await self._execute(
            f"INSERT INTO tools ({_TOOL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (org_id, name) DO UPDATE SET tier = excluded.tier, "
            "version = excluded.version, compensation = excluded.compensation, "
            "idempotent_upstream = excluded.idempotent_upstream, "
            "upstream = excluded.upstream, updated_us = excluded.updated_us",
            tool.org_id,
            tool.name,
            tool.tier,
            tool.version,
            tool.compensation_json,
            tool.idempotent_upstream,
            tool.upstream,
            tool.updated_us,
        )

    async def get_tool(self, org_id: str, name: str) -> ToolRecord | None:
        row = await self._fetchrow(
            f"SELECT {_TOOL_COLUMNS} FROM tools WHERE org_id = ? AND name = ?", org_id, name
        )
        return _tool(row) if row else None

    async def list_tools(self, org_id: str) -> list[ToolRecord]:
        rows = await self._fetch(
            f"SELECT {_TOOL_COLUMNS} FROM tools WHERE org_id = ? ORDER BY name", org_id
        )
        return [_tool(r) for r in rows]

    # -- sessions ----------------------------------------------------------------------------

    async def get_session(self, org_id: str, session_id: str) -> SessionRecord | None:
        row = await self._fetchrow(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE org_id = ? AND session_id = ?",
            org_id,
            session_id,
        )
        return _session(row) if row else None

    async def touch_session(
        self, org_id: str, session_id: str, step: int, now_us: int, owner: str | None = None
    ) -> SessionRecord:
        """Create the session if it is new (active, owned by the key id `owner`), note `step`
        as seen; return it. An existing session keeps its owner."""
        row = await self._fetchrow(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, 'active', ?, ?, ?, ?) "
            "ON CONFLICT (org_id, session_id) DO UPDATE SET "
            "last_step = CASE WHEN excluded.last_step > sessions.last_step "
            "THEN excluded.last_step ELSE sessions.last_step END, "
            f"updated_us = excluded.updated_us RETURNING {_SESSION_COLUMNS}",
            org_id,
            session_id,
            step,
            now_us,
            now_us,
            owner,
        )
        assert row is not None
        return _session(row)

    async def update_session(
        self,
        org_id: str,
        session_id: str,
        now_us: int,
        *,
        state: str | None = None,
        last_step: int | None = None,
    ) -> None:
        await self._execute(
            "UPDATE sessions SET state = COALESCE(?, state), "
            "last_step = CASE WHEN CAST(? AS BIGINT) > last_step THEN CAST(? AS BIGINT) "
            "ELSE last_step END, updated_us = ? WHERE org_id = ? AND session_id = ?",
            state,
            last_step,
            last_step,
            now_us,
            org_id,
            session_id,
        )

    async def list_sessions(
        self, org_id: str, limit: int = 100, owner: str | None = None
    ) -> list[SessionRecord]:
        """The org's sessions, latest first; with `owner`, only those that key id owns."""
        where, args = "org_id = ?", [org_id]
        if owner is not None:
            where, args = "org_id = ? AND owner_key_id = ?", [org_id, owner]
        rows = await self._fetch(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE {where} "
            "ORDER BY updated_us DESC, session_id LIMIT ?",
            *args,
            limit,
        )
        return [_session(r) for r in rows]

    async def session_owner(self, org_id: str, kind: str, id_: str) -> tuple[bool, str | None]:
        """Whether the org has a `kind` (session, effect, approval, undo_entry) with this id,
        and the owner key id of the session it belongs to (None: a session without owner)."""
        table, column = _OWNED_BY_SESSION[kind]
        if table == "sessions":
            sql = "SELECT owner_key_id FROM sessions WHERE org_id = ? AND session_id = ?"
        else:
            sql = (
                f"SELECT s.owner_key_id FROM {table} x LEFT JOIN sessions s "
                "ON s.org_id = x.org_id AND s.session_id = x.session_id "
                f"WHERE x.org_id = ? AND x.{column} = ?"
            )
        row = await self._fetchrow(sql, org_id, id_)
        return (False, None) if row is None else (True, row[0])

    # -- effects -----------------------------------------------------------------------------

    async def get_effect(self, org_id: str, effect_id: str) -> EffectRecord | None:
        row = await self._fetchrow(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE org_id = ? AND effect_id = ?",
            org_id,
            effect_id,
        )
        return _effect(row) if row else None

    async def get_effect_by_signature(self, org_id: str, signature: str) -> EffectRecord | None:
        row = await self._fetchrow(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE org_id = ? AND call_signature = ?",
            org_id,
            signature,
        )
        return _effect(row) if row else None

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
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE org_id = ? AND session_id = ? "
            f"AND tool_name = ? AND args = ? AND (state IN ({marks}){owed}) "
            "ORDER BY step_index DESC LIMIT 1",
            org_id,
            session_id,
            tool_name,
            args_json,
            *states,
            *undelivered_states,
        )
        return _effect(row) if row else None

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
            f"INSERT INTO effects ({EFFECT_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (org_id, call_signature) DO NOTHING",
            effect.effect_id,
            effect.org_id,
            effect.session_id,
            effect.step_index,
            effect.tool_name,
            effect.tool_version,
            effect.tier,
            effect.call_signature,
            effect.args_json,
            effect.state,
            effect.mode,
            effect.attempts,
            effect.result_json,
            effect.error,
            effect.lease_expires_us,
            effect.executed_us,
            effect.finished_us,
            effect.created_us,
            effect.updated_us,
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
        unknown = set(changes) - _EFFECT_FIELDS
        if unknown:
            raise ValueError(f"not updatable effect columns: {sorted(unknown)}")
        sets = ", ".join(f"{name} = ?" for name in changes)
        sql = f"UPDATE effects SET {sets} WHERE org_id = ? AND effect_id = ?"
        args = [*changes.values(), org_id, effect_id]
        if expect_state is not None:
            sql += " AND state = ?"
            args.append(expect_state)
        return await self._execute(sql, *args) == 1

    async def finish_effect(
        self,
        org_id: str,
        effect_id: str,
        *,
        target: str,
        result_json: str | None,
        error: str | None,
        now_us: int,
        event_type: str,
        extra: dict[str, Any],
    ) -> EffectRecord | None:
        """Move a running (or in-doubt) effect to `target` and log the event; None when it
        was in neither state (or does not exist). Dialects may do it in one statement.

        An SDK-run effect counts as delivered here: its runner reports what it has.
        """
        row = await self._fetchrow(
            "UPDATE effects SET state = ?, result = ?, error = ?, lease_expires_us = NULL, "
            "finished_us = ?, updated_us = ?, "
            "delivered_us = CASE WHEN mode = 'sdk' THEN ? ELSE delivered_us END "
            "WHERE org_id = ? AND effect_id = ? "
            f"AND state IN ('executing', 'in_doubt') RETURNING {EFFECT_COLUMNS}",
            target,
            result_json,
            error,
            now_us,
            now_us,
            now_us,
            org_id,
            effect_id,
        )
        if row is None:
            return None
        effect = _effect(row)
        payload = {"stage": target, "tool_name": effect.tool_name, "attempt": effect.attempts}
        payload.update(extra)
        await self.insert_event(
            org_id, event_type, effect.session_id, effect_id, orjson.dumps(payload).decode(), now_us
        )
        return effect

    async def renew_lease(
        self, org_id: str, effect_id: str, attempt: int, lease_expires_us: int
    ) -> bool:
        """Extend the lease of a run that is still going (the same attempt, still executing).

        One statement and no event: it runs every lease/3 for every call in flight. False when
        the run is over (committed, failed, in doubt) or another attempt took it over.
        """
        changed = await self._execute(
            "UPDATE effects SET lease_expires_us = ? WHERE org_id = ? AND effect_id = ? "
            "AND state = 'executing' AND attempts = ?",
            lease_expires_us,
            org_id,
            effect_id,
            attempt,
        )
        return changed == 1

    async def claim_expired_effects(self, now_us: int, limit: int = 100) -> list[EffectRecord]:
        """Executing effects of every org whose lease has expired (their process died).

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two sweepers never move the same effect.
        """
        rows = await self._fetch(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE state = 'executing' "
            "AND lease_expires_us <= ? ORDER BY lease_expires_us, effect_id "
            f"LIMIT ?{self._SKIP_LOCKED}",
            now_us,
            limit,
        )
        return [_effect(r) for r in rows]

    async def list_effects(self, org_id: str, session_id: str) -> list[EffectRecord]:
        rows = await self._fetch(
            f"SELECT {EFFECT_COLUMNS} FROM effects WHERE org_id = ? AND session_id = ? "
            "ORDER BY step_index, created_us",
            org_id,
            session_id,
        )
        return [_effect(r) for r in rows]

    # -- undo entries ------------------------------------------------------------------------

    async def insert_undo_entry(self, entry: UndoEntryRecord) -> int:
        """Push an entry on its session's undo stack; returns its `seq` (entry.seq is ignored)."""
        row = await self._fetchrow(
            f"INSERT INTO undo_entries ({_UNDO_COLUMNS.split(', ', 1)[1]}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
            entry.entry_id,
            entry.org_id,
            entry.session_id,
            entry.effect_id,
            entry.fn_name,
            entry.fn_version,
            entry.args_json,
            entry.max_retries,
            entry.retry_backoff_ms,
            entry.registered_us,
            entry.state,
            entry.attempts,
            entry.last_error,
            entry.updated_us,
            entry.runner,
            entry.lease_expires_us,
            entry.claim_token_hash,
        )
        assert row is not None
        return int(row[0])

    async def get_undo_entry(self, org_id: str, entry_id: str) -> UndoEntryRecord | None:
        row = await self._fetchrow(
            f"SELECT {_UNDO_COLUMNS} FROM undo_entries WHERE org_id = ? AND entry_id = ?",
            org_id,
            entry_id,
        )
        return _undo(row) if row else None

    async def list_undo_entries(self, org_id: str, session_id: str) -> list[UndoEntryRecord]:
        """A session's undo stack, newest (top) first."""
        rows = await self._fetch(
            f"SELECT {_UNDO_COLUMNS} FROM undo_entries WHERE org_id = ? AND session_id = ? "
            "ORDER BY seq DESC",
            org_id,
            session_id,
        )
        return [_undo(r) for r in rows]

    async def skip_pending_undo_entries(self, org_id: str, effect_id: str, now_us: int) -> int:
        """Mark an effect's not-yet-run undo entries `skipped` (nothing to undo)."""
        return await self._execute(
            "UPDATE undo_entries SET state = 'skipped', updated_us = ? "
            "WHERE org_id = ? AND effect_id = ? AND state = 'pending'",
            now_us,
            org_id,
            effect_id,
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
        unknown = set(changes) - _UNDO_FIELDS
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
            f"INSERT INTO approvals ({_APPROVAL_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            approval.approval_id,
            approval.org_id,
            approval.effect_id,
            approval.session_id,
            approval.tool_name,
            approval.args_json,
            approval.status,
            approval.created_us,
            approval.timeout_us,
            approval.decided_us,
            approval.decided_by,
            approval.reason,
        )

    async def get_approval(self, org_id: str, approval_id: str) -> ApprovalRecord | None:
        row = await self._fetchrow(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE org_id = ? AND approval_id = ?",
            org_id,
            approval_id,
        )
        return _approval(row) if row else None

    async def get_approval_for_effect(self, org_id: str, effect_id: str) -> ApprovalRecord | None:
        row = await self._fetchrow(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE org_id = ? AND effect_id = ?",
            org_id,
            effect_id,
        )
        return _approval(row) if row else None

    async def list_approvals(
        self, org_id: str, status: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        """Approvals newest first, the id breaking ties."""
        if status is None:
            rows = await self._fetch(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE org_id = ? "
                "ORDER BY created_us DESC, approval_id DESC LIMIT ?",
                org_id,
                limit,
            )
        else:
            rows = await self._fetch(
                f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE org_id = ? AND status = ? "
                "ORDER BY created_us DESC, approval_id DESC LIMIT ?",
                org_id,
                status,
                limit,
            )
        return [_approval(r) for r in rows]

    async def list_session_approvals(self, org_id: str, session_id: str) -> list[ApprovalRecord]:
        rows = await self._fetch(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE org_id = ? AND session_id = ? "
            "ORDER BY created_us, approval_id",
            org_id,
            session_id,
        )
        return [_approval(r) for r in rows]

    # Row locks for the sweeper: PostgreSQL skips rows another instance holds; SQLite's
    # single writer already serialises sweepers.
    _SKIP_LOCKED = ""

    async def claim_expired_approvals(self, now_us: int, limit: int = 100) -> list[ApprovalRecord]:
        """Pending approvals of every org whose timeout has passed, oldest deadline first.

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two instances never sweep the same approval.
        """
        rows = await self._fetch(
            f"SELECT {_APPROVAL_COLUMNS} FROM approvals WHERE status = 'pending' "
            f"AND timeout_us <= ? ORDER BY timeout_us, approval_id LIMIT ?{self._SKIP_LOCKED}",
            now_us,
            limit,
        )
        return [_approval(r) for r in rows]

    async def update_approval(
        self, org_id: str, approval_id: str, *, expect_status: str | None = None, **changes: Any
    ) -> bool:
        unknown = set(changes) - _APPROVAL_FIELDS
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
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE event_id > ? "
            f"ORDER BY event_id {order} LIMIT ?",
            after_id,
            limit,
        )
        return [_event(r) for r in rows]

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
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE org_id = ? AND event_id > ? "
                "ORDER BY event_id LIMIT ?",
                org_id,
                after_id,
                limit,
            )
        else:
            rows = await self._fetch(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE org_id = ? AND event_id > ? "
                "AND session_id = ? ORDER BY event_id LIMIT ?",
                org_id,
                after_id,
                session_id,
                limit,
            )
        return [_event(r) for r in rows]


class Store(abc.ABC):
    """A database behind the `Queries` above. Open one with `undolog.store.open_store`."""

    dialect: ClassVar[str]
    # Whether `execute_new` can intercept a new call in one round trip.
    executes_new_in_one_call: ClassVar[bool] = False

    async def execute_new(
        self,
        effect: EffectRecord,
        undo: UndoEntryRecord | None,
        event: tuple[str, str],
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """Intercept a new call in one round trip, where `executes_new_in_one_call`.

        First of all, with `owner_only`, a session that exists and is not `owner`'s (or has
        no owner) answers "forbidden" with nothing read or written. A session it creates is
        recorded as `owner`'s.

        If an effect has the signature: "replayed" when it is in one of `replay`'s states
        (and `replay`'s event, a type and a payload, is written), else "exists"; both return
        that effect. Otherwise, under the signature's lock (not waited for: "busy"), and only
        if the session, touched as `touch_session` does, is active ("closed"), insert
        `effect` with its undo entry and `event` ("inserted"). The engine decides when to
        ask; "exists", "busy" and "closed" send it down its full path, which holds the whole
        decision table.
        """
        raise NotImplementedError(f"{self.dialect} has no one-call execute_new")

    def on_events(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each commit that wrote events; returns a remover."""
        listeners: list[Callable[[], None]] = self.__dict__.setdefault("_event_listeners", [])
        listeners.append(callback)
        return lambda: listeners.remove(callback) if callback in listeners else None

    def _committed(self, q: Queries) -> None:
        if q.events_written:
            for callback in list(self.__dict__.get("_event_listeners", ())):
                callback()

    async def listen(self, channel: str, callback: Callable[[], None]) -> Callable[[], Any]:
        """Be called when another process announces events (PostgreSQL LISTEN); returns an
        async closer. Stores that cannot hear other processes do nothing."""

        async def close() -> None:
            return None

        return close

    async def announce(self, channel: str) -> None:
        """Tell other processes that events were written (PostgreSQL NOTIFY)."""
        return None

    @abc.abstractmethod
    def transaction(self, lock_key: str | None = None) -> AbstractAsyncContextManager[Queries]:
        """One write transaction; committed on a clean exit, rolled back on an exception.

        `lock_key` (a call signature) serialises transactions on the same key: PostgreSQL
        takes `pg_advisory_xact_lock` with bounded retries (`AdvisoryLockTimeout`); SQLite's
        `BEGIN IMMEDIATE` already serialises every writer.
        """

    @abc.abstractmethod
    def reader(self) -> AbstractAsyncContextManager[Queries]:
        """Reads outside a transaction (each statement sees committed data)."""

    def atomic(self) -> AbstractAsyncContextManager[Queries]:
        """For one `Queries` call that a dialect does in a single statement: no explicit
        transaction needed there (PostgreSQL). By default, a transaction."""
        return self.transaction()

    @abc.abstractmethod
    def autocommit(self) -> AbstractAsyncContextManager[Queries]:
        """Single-statement writes outside an explicit transaction (each commits alone)."""

    @abc.abstractmethod
    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""

    @abc.abstractmethod
    async def schema_version(self) -> int: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """The numbered SQL migrations shipped for a dialect, in order."""
    folder = resources.files("undolog.store").joinpath("migrations", dialect)
    found = []
    for item in folder.iterdir():
        match = _MIGRATION_NAME.match(item.name)
        if match:
            found.append((int(match.group(1)), item.read_text(encoding="utf-8")))
    return sorted(found)
