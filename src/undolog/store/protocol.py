"""The store as the engine sees it: typing protocols, no SQL.

`Store` opens units of work (`transaction`, `reader`, `autocommit`, `atomic`) that hand out
`Queries`, the reads and writes of rows (store/records.py). Two implementations ship:
SQLite (store/sqlite.py) and PostgreSQL (store/postgres.py), both on the shared SQL in
store/_sql/. The store knows nothing of the engine: it checks no state machine; where a
statement filters on a state, the state is a parameter (the defaults are the wire values).
See docs/architecture.md for the store contract.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from undolog.store.protocol_ops import OperatorQueries
from undolog.store.records import (
    ApprovalRecord,
    AuditHeadRecord,
    EffectRecord,
    EventRecord,
    Finish,
    KeyRecord,
    McpTaskRecord,
    OrgRecord,
    PolicyRecord,
    SessionRecord,
    ToolRecord,
    UndoEntryRecord,
)

__all__ = ["ExecuteNew", "NewCall", "NewRecords", "Queries", "Store"]

# What `Store.execute_new` did: wrote the new call, or replayed it, or found its signature
# taken, its lock busy or its session not active (the engine takes its full path).
# "forbidden": the session is another key's and the caller may use only its own.
ExecuteNew = Literal["inserted", "replayed", "exists", "busy", "closed", "forbidden"]

# A new call's records: its effect, its undo entry (if any) and its event (a type, a payload).
NewRecords = tuple[EffectRecord, UndoEntryRecord | None, tuple[str, str]]


@dataclass(frozen=True, slots=True)
class NewCall:
    """A new call as `Store.execute_new` takes it: the key a store looks it up by, and its
    records, built on demand. A store that reads before it writes (SQLite) builds them only
    when the signature is not taken, so a replay pays nothing for a call it does not make."""

    org_id: str
    session_id: str
    call_signature: str
    records: Callable[[], NewRecords]

    @classmethod
    def of(
        cls, effect: EffectRecord, undo: UndoEntryRecord | None, event: tuple[str, str]
    ) -> NewCall:
        """A new call whose records are already built."""
        built: NewRecords = (effect, undo, event)
        return cls(effect.org_id, effect.session_id, effect.call_signature, lambda: built)


class Queries(OperatorQueries, Protocol):
    """The reads and writes of one unit of work (one connection, maybe one transaction)."""

    # Set once an event row is written: the store tells its event listeners after commit.
    events_written: bool

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

    async def get_org(self, org_id: str) -> OrgRecord | None: ...

    async def put_api_key(self, key: KeyRecord) -> KeyRecord:
        """Store a key, or give a stored one (same hash) this org, name, role and source.

        A key listed again is live again (`revoked_us` cleared) and keeps its `key_id`:
        the config is the source of truth for the keys it names. Returns the stored row.
        """

    async def revoke_unlisted_keys(
        self, source: str, keep_hashes: Collection[str], now_us: int, org_id: str | None = None
    ) -> int:
        """Revoke the live keys of `source` (and of `org_id`, if given) not in `keep_hashes`;
        end their dashboard sessions. Returns how many keys were revoked."""

    async def revoke_key(self, key_id: str, now_us: int) -> bool:
        """Revoke a key and end its dashboard sessions; False if no live key has this id."""

    async def live_key(self, key_hash: str) -> KeyRecord | None:
        """The unrevoked key with this hash."""

    async def list_keys(self, org_id: str | None = None) -> list[KeyRecord]: ...

    async def touch_key(self, key_id: str, now_us: int) -> None: ...

    async def ensure_org_exists(self, org_id: str, now_us: int) -> None:
        """Create a bare org if there is none (an existing one is left as it is)."""

    async def insert_ui_session(
        self, session_hash: str, key_id: str, org_id: str, now_us: int, expires_us: int
    ) -> None: ...

    async def ui_session_key(self, session_hash: str, now_us: int) -> KeyRecord | None:
        """The live key behind a live dashboard session (not ended, not expired)."""

    async def end_ui_session(self, session_hash: str, now_us: int) -> None: ...

    async def upsert_tool(self, tool: ToolRecord) -> None: ...

    async def get_tool(self, org_id: str, name: str) -> ToolRecord | None: ...

    async def list_tools(self, org_id: str) -> list[ToolRecord]: ...

    async def get_policy(self, org_id: str) -> PolicyRecord | None:
        """The org's policy rules (None: never set)."""

    async def put_policy(self, policy: PolicyRecord) -> None:
        """Replace the org's policy rules whole."""

    async def get_session(self, org_id: str, session_id: str) -> SessionRecord | None: ...

    async def touch_session(
        self,
        org_id: str,
        session_id: str,
        step: int,
        now_us: int,
        owner: str | None = None,
        *,
        state: str = ...,
    ) -> SessionRecord:
        """Create the session if it is new (active, owned by the key id `owner`), note `step`
        as seen; return it. An existing session keeps its owner, and its `updated_us` unless
        that is older than `SESSION_TOUCH_US` (records.py)."""

    async def update_session(
        self,
        org_id: str,
        session_id: str,
        now_us: int,
        *,
        state: str | None = None,
        last_step: int | None = None,
    ) -> None:
        """Set the state (`updated_us` = `now_us`) and raise `last_step`; without a state, a
        touch: `updated_us` moves only when older than `SESSION_TOUCH_US`."""

    async def list_sessions(
        self, org_id: str, limit: int = 100, owner: str | None = None
    ) -> list[SessionRecord]:
        """The org's sessions, latest first; with `owner`, only those that key id owns."""

    async def session_owner(self, org_id: str, kind: str, id_: str) -> tuple[bool, str | None]:
        """Whether the org has a `kind` (session, effect, approval, undo_entry) with this id,
        and the owner key id of the session it belongs to (None: a session without owner)."""

    async def get_effect(self, org_id: str, effect_id: str) -> EffectRecord | None: ...

    async def get_effect_by_signature(self, org_id: str, signature: str) -> EffectRecord | None: ...

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

    async def mark_delivered(
        self, org_id: str, effect_ids: Sequence[str], states: Sequence[str], now_us: int
    ) -> int:
        """Note that these effects' answers reached their client, if they are in `states`."""

    async def insert_effect(self, effect: EffectRecord) -> bool:
        """Insert an effect unless its signature exists in the org; True when inserted."""

    async def insert_executing_effect(
        self,
        effect: EffectRecord,
        undo: UndoEntryRecord | None,
        event_type: str,
        payload_json: str,
    ) -> bool:
        """Insert a new effect with its undo entry (if any) and its event, unless the
        signature exists in the org; True when inserted. Dialects may do it in one statement."""

    async def update_effect(
        self, org_id: str, effect_id: str, *, expect_state: str | None = None, **changes: Any
    ) -> bool:
        """Set columns of an effect; with `expect_state`, only if it is still in that state.

        Returns True when a row changed (False means the effect moved on concurrently).
        """

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`finish` (see `Finish`); None when the effect was in none of its `from_states` (or
        does not exist), and then nothing is written. Dialects may do it in one statement."""

    async def renew_lease(
        self,
        org_id: str,
        effect_id: str,
        attempt: int,
        lease_expires_us: int,
        *,
        running: str = ...,
    ) -> bool:
        """Extend the lease of a run that is still going (the same attempt, still executing).

        One statement and no event: it runs every lease/3 for every call in flight. False when
        the run is over (committed, failed, in doubt) or another attempt took it over.
        """

    async def claim_expired_effects(
        self, now_us: int, limit: int = 100, *, running: str = ...
    ) -> list[EffectRecord]:
        """Executing effects of every org whose lease has expired (their process died).

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two sweepers never move the same effect.
        """

    async def list_effects(self, org_id: str, session_id: str) -> list[EffectRecord]: ...

    async def insert_undo_entry(self, entry: UndoEntryRecord) -> int:
        """Push an entry on its session's undo stack; returns its `seq` (entry.seq is ignored)."""

    async def get_undo_entry(self, org_id: str, entry_id: str) -> UndoEntryRecord | None: ...

    async def list_undo_entries(self, org_id: str, session_id: str) -> list[UndoEntryRecord]:
        """A session's undo stack, newest (top) first."""

    async def skip_pending_undo_entries(
        self,
        org_id: str,
        effect_id: str,
        now_us: int,
        *,
        pending: str = ...,
        skipped: str = ...,
    ) -> int:
        """Mark an effect's not-yet-run undo entries (`pending`) `skipped` (nothing to undo)."""

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

    async def insert_approval(self, approval: ApprovalRecord) -> None: ...

    async def get_approval(self, org_id: str, approval_id: str) -> ApprovalRecord | None: ...

    # -- MCP tasks (migration 19): task-augmented `tools/call`s of the gateway -----------------

    async def insert_mcp_task(self, task: McpTaskRecord) -> None: ...

    async def get_mcp_task(self, org_id: str, task_id: str) -> McpTaskRecord | None: ...

    async def end_mcp_task(
        self, org_id: str, task_id: str, result_json: str, ended_us: int, answers_effect: bool
    ) -> bool:
        """Keep the answer of a task that has ended (migration 23); False when it already had
        one: that answer stands."""

    async def delete_expired_mcp_tasks(self, org_id: str | None, now_us: int, limit: int) -> int:
        """Delete up to `limit` of the org's tasks (None: any org's) whose `expires_us` has
        passed."""

    async def get_approval_for_effect(
        self, org_id: str, effect_id: str
    ) -> ApprovalRecord | None: ...

    async def list_approvals(
        self, org_id: str, status: str | None = None, limit: int = 100
    ) -> list[ApprovalRecord]:
        """Approvals newest first, the id breaking ties."""

    async def list_session_approvals(
        self, org_id: str, session_id: str
    ) -> list[ApprovalRecord]: ...

    async def claim_expired_approvals(
        self, now_us: int, limit: int = 100, *, pending: str = ...
    ) -> list[ApprovalRecord]:
        """Pending approvals of every org whose timeout has passed, oldest deadline first.

        Inside a transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`)
        until it ends, so two instances never sweep the same approval.
        """

    async def update_approval(
        self, org_id: str, approval_id: str, *, expect_status: str | None = None, **changes: Any
    ) -> bool: ...

    async def get_audit_head(self, org_id: str) -> AuditHeadRecord | None:
        """Where the org's audit chain stood after its last export (None: never exported)."""

    async def put_audit_head(self, head: AuditHeadRecord, expect_hash: str | None) -> bool:
        """Store the org's new audit head if the stored one is still `expect_hash` (None:
        none yet); False when another export moved it first."""

    async def last_audit_seq(self, org_id: str) -> int:
        """The last per-org sequence number an event of the org took (0: none yet)."""

    async def list_audit_events(
        self, org_id: str, after_seq: int, upto_seq: int, limit: int
    ) -> list[tuple[int, EventRecord]]:
        """The org's events numbered above `after_seq` and up to `upto_seq`, in number order,
        each with its number (migration 24)."""

    async def list_audit_chain(
        self, org_id: str, after_seq: int, upto_seq: int, limit: int
    ) -> list[tuple[int, EventRecord | None, str | None]]:
        """The org's events and retention's marks of pruned events (migration 25) numbered
        above `after_seq` and up to `upto_seq`, in number order, read at once: (number,
        event, None) or (number, None, the pruned record's hash); an event comes before a
        mark of the same number."""

    async def last_audit_pruned_below(self, org_id: str, below_seq: int) -> tuple[int, str] | None:
        """The org's last mark of a pruned event numbered below `below_seq`: (number, hash)."""

    async def get_pruned_call(self, org_id: str, effect_id: str) -> str | None:
        """The audit `call` (canonical JSON) kept of a pruned effect (None: none kept)."""

    async def count_by_state(self, org_id: str, table: str) -> dict[str, int]:
        """How many rows of an org's `effects`, `sessions` or `approvals` are in each state."""

    async def count_events(self, org_id: str, type_: str) -> int:
        """How many events of one type an org has (e.g. `effect_replayed`: replays)."""

    async def pending_approvals_by_age(self, cutoffs_us: Sequence[int]) -> dict[str, list[int]]:
        """Across orgs: {org: [pending approvals created at or before each cutoff]}."""

    async def effects_in_doubt_by_org(self) -> dict[str, int]:
        """Across orgs: {org: effects in doubt now}."""

    async def insert_event(
        self,
        org_id: str,
        type_: str,
        session_id: str | None,
        effect_id: str | None,
        payload_json: str,
        now_us: int,
    ) -> int: ...

    async def list_events_since(
        self, after_id: int, limit: int, *, newest: bool = False
    ) -> list[EventRecord]:
        """Events of every org above `after_id`, oldest first (or just the newest ones)."""

    async def list_event_ids_since(self, after_id: int, limit: int) -> list[int]:
        """The ids of the events of every org above `after_id`, oldest first."""

    async def list_events(
        self,
        org_id: str,
        after_id: int = 0,
        limit: int = 1000,
        session_id: str | None = None,
    ) -> list[EventRecord]:
        """Events of an org with an id above `after_id`, oldest first."""


class Store(Protocol):
    """A database behind `Queries`. Open one with `undolog.store.open_store`."""

    dialect: ClassVar[str]

    async def execute_new(
        self,
        new: NewCall,
        replay: tuple[Collection[str], str, str],
        *,
        owner: str | None = None,
        owner_only: bool = False,
    ) -> tuple[ExecuteNew, EffectRecord | None]:
        """Record a new call: the one operation for it, which every store implements its own
        way (PostgreSQL: one round trip, the `undolog_execute_new` function; SQLite: its own
        `BEGIN IMMEDIATE` transaction). The engine asks for every numbered call that the
        decision table would execute if it were new in an active session.

        First of all, with `owner_only`, a session that exists and is not `owner`'s (or has
        no owner) answers "forbidden" with nothing read or written. A session it creates is
        recorded as `owner`'s.

        If an effect has the signature: "replayed" when it is in one of `replay`'s states
        (and `replay`'s event, a type and a payload, is written), else "exists"; both return
        that effect. A store may answer "exists" for a replayable one too: the engine then
        replays it, its event written best-effort on its own (SQLite does). Otherwise, under
        the signature's lock (not waited for: "busy"), and only if the session, touched as
        `touch_session` does, is active ("closed"), insert `new`'s records — its effect with
        its undo entry and event ("inserted"); a store calls `new.records()` only when it
        writes them or must send them (once at most). The engine decides when to ask;
        "exists", "busy" and "closed" send it down its full path, which holds the whole
        decision table.
        """

    async def finish_effect(self, finish: Finish) -> EffectRecord | None:
        """`Queries.finish_effect` as a unit of work of its own: committed (on disk) when it
        returns. A store may send concurrent ones together (PostgreSQL: one statement, one
        transaction for the finishes that wait for one another, `store/pg_group.py`); each
        is what it would be alone. SQLite: `Queries.finish_effect` in `atomic()`."""

    def on_events(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each commit that wrote events; returns a remover."""

    async def listen(self, channel: str, callback: Callable[[], None]) -> Callable[[], Any]:
        """Be called when another process announces events (PostgreSQL LISTEN); returns an
        async closer. Stores that cannot hear other processes do nothing."""

    async def announce(self, channel: str) -> None:
        """Tell other processes that events were written (PostgreSQL NOTIFY)."""

    def transaction(self, lock_key: str | None = None) -> AbstractAsyncContextManager[Queries]:
        """One write transaction; committed on a clean exit, rolled back on an exception.

        `lock_key` (a call signature) serialises transactions on the same key: PostgreSQL
        takes `pg_advisory_xact_lock` with bounded retries (`AdvisoryLockTimeout`); SQLite's
        `BEGIN IMMEDIATE` already serialises every writer.
        """

    def reader(self) -> AbstractAsyncContextManager[Queries]:
        """Reads outside a transaction (each statement sees committed data)."""

    def atomic(self) -> AbstractAsyncContextManager[Queries]:
        """For one `Queries` call that a dialect does in a single statement: no explicit
        transaction needed there (PostgreSQL). SQLite: a transaction."""

    def autocommit(self) -> AbstractAsyncContextManager[Queries]:
        """Single-statement writes outside an explicit transaction (each commits alone)."""

    async def migrate(self) -> int:
        """Apply pending migrations; return the schema version now in force."""

    async def schema_version(self) -> int: ...

    async def writable(self) -> bool:
        """Whether the store answers and takes writes now (`/ready`): a PostgreSQL standby or
        a read-only database answers reads but does not. Raises `Database` when it does not
        answer at all."""

    async def close(self) -> None: ...
