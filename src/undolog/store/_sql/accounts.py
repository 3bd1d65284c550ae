"""Shared SQL, part 1: the dialect primitives, orgs, API keys, dashboard sessions, tools and
agent sessions (see the package docstring)."""

from __future__ import annotations

import abc
from collections.abc import Collection, Sequence
from typing import Any

from undolog.store._sql.rows import (
    AUDIT_HEAD,
    EVENT,
    KEY,
    ORG,
    OWNED_BY_SESSION,
    POLICY,
    SESSION,
    TOOL,
)
from undolog.store.records import (
    SESSION_TOUCH_US,
    AuditHeadRecord,
    EventRecord,
    KeyRecord,
    OrgRecord,
    PolicyRecord,
    SessionRecord,
    ToolRecord,
)
from undolog_sdk.wire import SessionState


class AccountSql(abc.ABC):
    """Statements of the store on accounts and sessions, over three dialect primitives; the
    whole set, bound to one connection (and maybe one transaction), is `SqlQueries`."""

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
        self,
        org_id: str,
        name: str,
        approval_timeout_s: int,
        auto_approve: bool,
        now_us: int,
        retention_days: int | None = None,
    ) -> None:
        """Create or update an org's policy (`retention_days` None: keep forever)."""
        await self._execute(
            "INSERT INTO orgs (org_id, name, approval_timeout_s, auto_approve_on_timeout, "
            "created_us, retention_days) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (org_id) DO "
            "UPDATE SET name = excluded.name, approval_timeout_s = excluded.approval_timeout_s, "
            "auto_approve_on_timeout = excluded.auto_approve_on_timeout, "
            "retention_days = excluded.retention_days",
            org_id,
            name,
            approval_timeout_s,
            auto_approve,
            now_us,
            retention_days,
        )

    async def get_org(self, org_id: str) -> OrgRecord | None:
        row = await self._fetchrow(f"SELECT {ORG.select()} FROM orgs WHERE org_id = ?", org_id)
        return ORG.row(row) if row else None

    async def put_api_key(self, key: KeyRecord) -> KeyRecord:
        """Store a key, or give a stored one (same hash) this org, name, role and source.

        A key listed again is live again (`revoked_us` cleared) and keeps its `key_id`:
        the config is the source of truth for the keys it names. Returns the stored row.
        """
        await self._execute(
            f"{KEY.insert('api_keys')} "
            "ON CONFLICT (key_hash) DO UPDATE SET org_id = excluded.org_id, "
            "name = excluded.name, role = excluded.role, source = excluded.source, "
            "revoked_us = NULL",
            *KEY.values(key),
        )
        row = await self._fetchrow(
            f"SELECT {KEY.select()} FROM api_keys WHERE key_hash = ?", key.key_hash
        )
        assert row is not None
        return KEY.row(row)

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
            f"SELECT {KEY.select()} FROM api_keys WHERE key_hash = ? AND revoked_us IS NULL",
            key_hash,
        )
        return KEY.row(row) if row else None

    async def list_keys(self, org_id: str | None = None) -> list[KeyRecord]:
        if org_id is None:
            rows = await self._fetch(f"SELECT {KEY.select()} FROM api_keys ORDER BY created_us")
        else:
            rows = await self._fetch(
                f"SELECT {KEY.select()} FROM api_keys WHERE org_id = ? ORDER BY created_us",
                org_id,
            )
        return [KEY.row(row) for row in rows]

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
        row = await self._fetchrow(
            f"SELECT {KEY.select('k')} FROM ui_sessions s JOIN api_keys k ON k.key_id = s.key_id "
            "WHERE s.session_hash = ? AND s.ended_us IS NULL AND s.expires_us > ? "
            "AND k.revoked_us IS NULL AND k.org_id = s.org_id",
            session_hash,
            now_us,
        )
        return KEY.row(row) if row else None

    async def end_ui_session(self, session_hash: str, now_us: int) -> None:
        await self._execute(
            "UPDATE ui_sessions SET ended_us = ? WHERE session_hash = ? AND ended_us IS NULL",
            now_us,
            session_hash,
        )

    # -- tools -------------------------------------------------------------------------------

    async def upsert_tool(self, tool: ToolRecord) -> None:
        await self._execute(
            f"{TOOL.insert('tools')} "
            "ON CONFLICT (org_id, name) DO UPDATE SET tier = excluded.tier, "
            "version = excluded.version, compensation = excluded.compensation, "
            "idempotent_upstream = excluded.idempotent_upstream, "
            "upstream = excluded.upstream, updated_us = excluded.updated_us",
            *TOOL.values(tool),
        )

    async def get_tool(self, org_id: str, name: str) -> ToolRecord | None:
        row = await self._fetchrow(
            f"SELECT {TOOL.select()} FROM tools WHERE org_id = ? AND name = ?", org_id, name
        )
        return TOOL.row(row) if row else None

    async def list_tools(self, org_id: str) -> list[ToolRecord]:
        rows = await self._fetch(
            f"SELECT {TOOL.select()} FROM tools WHERE org_id = ? ORDER BY name", org_id
        )
        return [TOOL.row(r) for r in rows]

    # -- policy rules (migration 13) ----------------------------------------------------------

    async def get_policy(self, org_id: str) -> PolicyRecord | None:
        """The org's policy rules (None: never set)."""
        row = await self._fetchrow(
            f"SELECT {POLICY.select()} FROM policy_rules WHERE org_id = ?", org_id
        )
        return POLICY.row(row) if row else None

    async def put_policy(self, policy: PolicyRecord) -> None:
        """Replace the org's policy rules whole."""
        await self._execute(
            f"{POLICY.insert('policy_rules')} ON CONFLICT (org_id) DO UPDATE SET "
            "rules = excluded.rules, updated_us = excluded.updated_us, "
            "updated_by = excluded.updated_by",
            *POLICY.values(policy),
        )

    # -- sessions ----------------------------------------------------------------------------

    async def get_session(self, org_id: str, session_id: str) -> SessionRecord | None:
        row = await self._fetchrow(
            f"SELECT {SESSION.select()} FROM sessions WHERE org_id = ? AND session_id = ?",
            org_id,
            session_id,
        )
        return SESSION.row(row) if row else None

    async def touch_session(
        self,
        org_id: str,
        session_id: str,
        step: int,
        now_us: int,
        owner: str | None = None,
        *,
        state: str = SessionState.ACTIVE.value,
    ) -> SessionRecord:
        """Create the session if it is new (active, owned by the key id `owner`), note `step`
        as seen; return it. An existing session keeps its owner, and its `updated_us` unless
        that is older than `SESSION_TOUCH_US`: most touches then change no indexed column
        (on PostgreSQL a HOT update, which writes no index entry)."""
        row = await self._fetchrow(
            f"INSERT INTO sessions ({SESSION.select()}) VALUES ({SESSION.marks()}) "
            "ON CONFLICT (org_id, session_id) DO UPDATE SET "
            "last_step = CASE WHEN excluded.last_step > sessions.last_step "
            "THEN excluded.last_step ELSE sessions.last_step END, "
            "updated_us = CASE WHEN sessions.updated_us < "
            f"excluded.updated_us - {SESSION_TOUCH_US} "
            "THEN excluded.updated_us ELSE sessions.updated_us END "
            f"RETURNING {SESSION.select()}",
            *SESSION.values(SessionRecord(org_id, session_id, state, step, now_us, now_us, owner)),
        )
        assert row is not None
        return SESSION.row(row)

    async def update_session(
        self,
        org_id: str,
        session_id: str,
        now_us: int,
        *,
        state: str | None = None,
        last_step: int | None = None,
    ) -> None:
        """Set the state (and `updated_us`), raise `last_step`. Without a state it is a touch,
        as in `touch_session`: `updated_us` moves only when older than `SESSION_TOUCH_US`."""
        touched = "?"
        if state is None:
            touched = (
                f"CASE WHEN updated_us < CAST(? AS BIGINT) - {SESSION_TOUCH_US} "
                "THEN CAST(? AS BIGINT) ELSE updated_us END"
            )
        await self._execute(
            "UPDATE sessions SET state = COALESCE(?, state), "
            "last_step = CASE WHEN CAST(? AS BIGINT) > last_step THEN CAST(? AS BIGINT) "
            f"ELSE last_step END, updated_us = {touched} WHERE org_id = ? AND session_id = ?",
            state,
            last_step,
            last_step,
            *((now_us,) if state is not None else (now_us, now_us)),
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
            f"SELECT {SESSION.select()} FROM sessions WHERE {where} "
            "ORDER BY updated_us DESC, session_id LIMIT ?",
            *args,
            limit,
        )
        return [SESSION.row(r) for r in rows]

    async def session_owner(self, org_id: str, kind: str, id_: str) -> tuple[bool, str | None]:
        """Whether the org has a `kind` (session, effect, approval, undo_entry) with this id,
        and the owner key id of the session it belongs to (None: a session without owner)."""
        table, column = OWNED_BY_SESSION[kind]
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

    # -- audit chain heads -------------------------------------------------------------------

    async def get_audit_head(self, org_id: str) -> AuditHeadRecord | None:
        """Where the org's audit chain stood after its last export (None: never exported)."""
        row = await self._fetchrow(
            f"SELECT {AUDIT_HEAD.select()} FROM audit_heads WHERE org_id = ?", org_id
        )
        return AUDIT_HEAD.row(row) if row else None

    async def last_audit_seq(self, org_id: str) -> int:
        """The last per-org sequence number an event of the org took (0: none yet)."""
        row = await self._fetchrow("SELECT last_seq FROM audit_sequences WHERE org_id = ?", org_id)
        return int(row[0]) if row else 0

    async def list_audit_events(
        self, org_id: str, after_seq: int, upto_seq: int, limit: int
    ) -> list[tuple[int, EventRecord]]:
        """The org's events numbered above `after_seq` and up to `upto_seq`, in number order,
        each with its number (migration 24).
        """
        rows = await self._fetch(
            f"SELECT audit_seq, {EVENT.select()} FROM events WHERE org_id = ? "
            "AND audit_seq > ? AND audit_seq <= ? ORDER BY audit_seq LIMIT ?",
            org_id, after_seq, upto_seq, limit,
        )  # fmt: skip
        return [(int(r[0]), EVENT.row(tuple(r)[1:])) for r in rows]

    async def list_audit_chain(
        self, org_id: str, after_seq: int, upto_seq: int, limit: int
    ) -> list[tuple[int, EventRecord | None, str | None]]:
        """The org's events and retention's marks (migration 25) numbered above `after_seq`
        and up to `upto_seq`, in number order, in one statement (one snapshot): (number,
        event, None) or (number, None, the pruned record's hash); an event before a mark of
        the same number."""
        # Typed: a bare NULL in a subquery is TEXT to PostgreSQL, which the UNION refuses.
        nulls = ", ".join(
            f"CAST(NULL AS {'BIGINT' if name in ('event_id', 'created_us') else 'TEXT'})"
            for name in EVENT.names
        )
        rows = await self._fetch(
            "SELECT * FROM (SELECT * FROM ("
            f"SELECT audit_seq, {EVENT.select()}, NULL AS record_hash FROM events "
            "WHERE org_id = ? AND audit_seq > ? AND audit_seq <= ? "
            "ORDER BY audit_seq LIMIT ?) e UNION ALL SELECT * FROM ("
            f"SELECT audit_seq, {nulls}, record_hash FROM audit_pruned_events "
            "WHERE org_id = ? AND audit_seq > ? AND audit_seq <= ? "
            "ORDER BY audit_seq LIMIT ?) p) c ORDER BY audit_seq, record_hash IS NOT NULL LIMIT ?",
            org_id, after_seq, upto_seq, limit, org_id, after_seq, upto_seq, limit, limit,
        )  # fmt: skip
        width = len(EVENT.names)
        return [
            (int(r[0]), None, str(r[-1]))
            if r[-1] is not None
            else (int(r[0]), EVENT.row(tuple(r)[1 : 1 + width]), None)
            for r in rows
        ]

    async def last_audit_pruned_below(self, org_id: str, below_seq: int) -> tuple[int, str] | None:
        """The org's last mark of a pruned event numbered below `below_seq`: (number, hash)."""
        row = await self._fetchrow(
            "SELECT audit_seq, record_hash FROM audit_pruned_events WHERE org_id = ? "
            "AND audit_seq < ? ORDER BY audit_seq DESC LIMIT 1",
            org_id,
            below_seq,
        )
        return (int(row[0]), str(row[1])) if row else None

    async def get_pruned_call(self, org_id: str, effect_id: str) -> str | None:
        """The audit `call` (canonical JSON) kept of a pruned effect (None: none kept)."""
        row = await self._fetchrow(
            "SELECT call_json FROM audit_pruned_calls WHERE org_id = ? AND effect_id = ?",
            org_id,
            effect_id,
        )
        return str(row[0]) if row else None

    async def put_audit_head(self, head: AuditHeadRecord, expect_hash: str | None) -> bool:
        """Store the org's new head, only if the stored one is still `expect_hash` (None:
        no head yet); False when another export moved it first."""
        if expect_hash is None:
            sql = f"{AUDIT_HEAD.insert('audit_heads')} ON CONFLICT (org_id) DO NOTHING"
            return await self._execute(sql, *AUDIT_HEAD.values(head)) == 1
        changed = await self._execute(
            "UPDATE audit_heads SET head_hash = ?, last_event_id = ?, record_count = ?, "
            "exported_us = ? WHERE org_id = ? AND head_hash = ?",
            head.head_hash, head.last_event_id, head.record_count, head.exported_us,
            head.org_id, expect_hash,
        )  # fmt: skip
        return changed == 1
