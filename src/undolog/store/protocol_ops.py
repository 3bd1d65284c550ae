"""The operator-facing half of `Queries` (store/protocol.py): the dashboard's keyset pages,
retention's bounded statements (docs/retention.md) and the webhook outbox
(docs/notifications.md). Typing protocols, no SQL; the shared SQL is in store/_sql/.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from undolog.store.records import (
    ApprovalRecord,
    EffectRecord,
    EventRecord,
    SessionRecord,
    WebhookDeliveryRecord,
)

__all__ = ["OperatorQueries"]


class OperatorQueries(Protocol):
    """Lists, retention and the outbox: what operators and background sweeps read and prune."""

    # -- the dashboard's lists (docs/dashboard.md): keyset pages, newest first ---------------

    async def page_sessions(
        self,
        org_id: str,
        limit: int,
        *,
        after: tuple[int, str] | None = None,
        owner: str | None = None,
        state: str | None = None,
        text: str | None = None,
    ) -> list[tuple[SessionRecord, str | None]]:
        """A page of sessions, latest update first, after the keyset (updated_us,
        session_id), each with its creating key's name; filtered by owner key id, state, and
        `text` found in the session id, the key's name or a tool it called."""

    async def page_approvals(
        self,
        org_id: str,
        limit: int,
        *,
        after: tuple[int, str] | None = None,
        status: str | None = None,
        tool: str | None = None,
        approval_id: str | None = None,
    ) -> list[tuple[ApprovalRecord, str | None]]:
        """A page of approvals, newest first, after the keyset (created_us, approval_id),
        each with the name of the key whose call asked for it."""

    async def effect_modes(self, org_id: str, effect_ids: Sequence[str]) -> dict[str, str]:
        """Who runs each of these effects (`proxy` or `sdk`), by effect id (beside the
        approvals of a page: only a proxy-executed call's arguments can be changed)."""

    async def recent_effects(
        self, org_id: str, session_ids: Sequence[str], per_session: int
    ) -> dict[str, list[EffectRecord]]:
        """The last `per_session` effects (highest step first) of each session."""

    async def recent_events(
        self,
        org_id: str,
        limit: int,
        *,
        owner: str | None = None,
        session_id: str | None = None,
    ) -> list[EventRecord]:
        """The last `limit` events, newest first (of `owner`'s sessions / of one session)."""

    # -- retention (docs/retention.md): every statement bounded, for short transactions --

    async def orgs_with_retention(self) -> list[tuple[str, int]]:
        """(org id, retention days) of every org that does not keep everything."""

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
        """Up to `limit` (session id, updated_us) of sessions that may be pruned, oldest
        first, after the (updated_us, session_id) cursor `after`.

        Last updated before `cutoff_us`; in a `done` state, or in an `unwound_only` one
        with no undo entry in `unwind_undo`; no effect in `busy_effects` or updated since
        the cutoff, no undo entry in `busy_undo`, no approval in `open_approvals`. Inside a
        transaction on PostgreSQL the rows stay locked (`FOR UPDATE SKIP LOCKED`).
        """

    async def count_session_rows(self, org_id: str, session_ids: Sequence[str]) -> dict[str, int]:
        """Rows per table (sessions, effects, undo_entries, approvals) of these sessions."""

    async def delete_sessions(self, org_id: str, session_ids: Sequence[str]) -> dict[str, int]:
        """Delete these sessions and their effects, undo entries and approvals (not their
        events); the rows deleted per table."""

    async def event_chunk(
        self, org_id: str, after_id: int, limit: int
    ) -> list[tuple[int, int, str | None, int]]:
        """The org's next `limit` (event id, created_us, session id, audit_seq) above
        `after_id`."""

    async def existing_sessions(self, org_id: str, session_ids: Sequence[str]) -> set[str]:
        """Which of these sessions the org still has."""

    async def delete_events(
        self, org_id: str, event_ids: Sequence[int], cutoff_us: int
    ) -> list[int]:
        """Delete those of these events older than `cutoff_us` whose session is gone (or
        that have none); the numbers (`audit_seq`) of those that went."""

    async def lock_org_prune(self, org_id: str) -> bool:
        """Take the org's prune lock for the transaction if free (PostgreSQL: an advisory
        lock; SQLite: always True, one writer); False when another pruner holds it."""

    async def put_audit_pruned(
        self, org_id: str, marks: Sequence[tuple[int, str]], now_us: int
    ) -> None:
        """Record pruned events (migration 25): (audit_seq, the hash of its audit record)."""

    async def session_effects(self, org_id: str, session_ids: Sequence[str]) -> list[EffectRecord]:
        """The effects of these sessions."""

    async def put_pruned_calls(
        self, org_id: str, calls: Sequence[tuple[str, str]], now_us: int
    ) -> None:
        """Keep the audit `call` (canonical JSON) of pruned effects: (effect id, call)."""

    async def delete_pruned_calls(self, org_id: str, before_us: int) -> int:
        """Forget the kept calls of effects pruned before `before_us`; how many went."""

    # -- the webhook outbox (migration 14; rows written by a trigger on `events`) ----------

    async def replace_webhook_subscriptions(
        self, subscriptions: Sequence[tuple[str, str, str]]
    ) -> None:
        """Make the subscriptions exactly these `(org_id, event_type, webhook)` rows."""

    async def claim_webhook_deliveries(
        self, now_us: int, lease_until_us: int, limit: int, *, pending: str
    ) -> list[tuple[WebhookDeliveryRecord, EventRecord]]:
        """Due `pending` rows, oldest first, with their events; each claimed (attempts + 1,
        not due again before `lease_until_us`). Inside a transaction (PostgreSQL: `FOR
        UPDATE SKIP LOCKED`, so two processes never claim one row)."""

    async def settle_webhook_delivery(
        self,
        delivery_id: int,
        attempts: int,
        *,
        state: str,
        next_attempt_us: int,
        last_error: str | None,
        now_us: int,
        pending: str,
    ) -> bool:
        """Record one attempt's outcome, if the row is still `pending` under that attempt's
        claim; True when it changed."""

    async def list_webhook_deliveries(
        self, org_id: str | None, state: str | None, limit: int
    ) -> list[WebhookDeliveryRecord]:
        """Outbox rows, newest first; of one org and one state when given."""
