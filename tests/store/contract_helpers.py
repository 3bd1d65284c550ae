"""Builders the store-contract tests share (records, orgs, effects)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable
from dataclasses import replace
from typing import Any

from undolog.store import (
    ApprovalRecord,
    EffectRecord,
    Finish,
    Store,
    ToolRecord,
    UndoEntryRecord,
)
from undolog.store.base import load_migrations

NOW = 1_700_000_000_000_000
LATEST = max(version for version, _ in load_migrations("sqlite"))  # the newest schema version


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


def new_session() -> str:
    return str(uuid.uuid4())


def new_signature() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


EFFECT = EffectRecord(
    effect_id="",
    org_id="",
    session_id="",
    step_index=1,
    tool_name="send_email",
    tool_version="1.0.0",
    tier="compensable",
    call_signature="",
    args_json='{"to":"a@example.com"}',
    state="executing",
    mode="proxy",
    attempts=1,
    result_json=None,
    error=None,
    lease_expires_us=NOW + 60_000_000,
    executed_us=NOW + 1,
    finished_us=None,
    created_us=NOW,
    updated_us=NOW,
)


def make_effect(org_id: str, **changes: Any) -> EffectRecord:
    """An effect with fresh ids (its own session and signature unless given)."""
    fresh = {"session_id": new_session(), "call_signature": new_signature()}
    return replace(EFFECT, effect_id=str(uuid.uuid4()), org_id=org_id, **(fresh | changes))


def make_undo(effect: EffectRecord) -> UndoEntryRecord:
    return UndoEntryRecord(
        seq=0,  # assigned by the store
        entry_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        session_id=effect.session_id,
        effect_id=effect.effect_id,
        fn_name="undo_send_email",
        fn_version="1.0.0",
        args_json='{"to":"a@example.com"}',
        max_retries=3,
        retry_backoff_ms=1000,
        registered_us=NOW,
        state="pending",
        attempts=0,
        last_error=None,
        updated_us=NOW,
    )


def make_approval(effect: EffectRecord, *, created_us: int = NOW, **changes: Any) -> ApprovalRecord:
    approval = ApprovalRecord(
        approval_id=str(uuid.uuid4()),
        org_id=effect.org_id,
        effect_id=effect.effect_id,
        session_id=effect.session_id,
        tool_name=effect.tool_name,
        args_json=effect.args_json,
        status="pending",
        created_us=created_us,
        timeout_us=created_us + 3_600_000_000,
        decided_us=None,
        decided_by=None,
        reason=None,
    )
    return replace(approval, **changes)


def make_tool(org_id: str, name: str, *, tier: str = "compensable") -> ToolRecord:
    compensation = '{"fn_name":"undo"}' if tier == "compensable" else None
    return ToolRecord(org_id, name, tier, "1.0.0", compensation, False, None, NOW)


async def add_org(store: Store, org_id: str, *, timeout_s: int = 3600) -> None:
    async with store.transaction() as q:
        await q.upsert_org(org_id, f"name of {org_id}", timeout_s, False, NOW)


async def add_effect(store: Store, effect: EffectRecord) -> None:
    async with store.transaction() as q:
        assert await q.insert_effect(effect)


# A finish as the tests send it (`Store.finish_effect`): a commit, unless changed.
FINISHED_US = NOW + 5
COMMIT_RESULT = '{"success":true,"output":1,"error":null}'


async def running_effects(store: Store, org_id: str, count: int) -> list[EffectRecord]:
    """`count` executing effects, each in a session of its own."""
    effects = [make_effect(org_id) for _ in range(count)]
    async with store.transaction() as q:
        for effect in effects:
            await q.touch_session(org_id, effect.session_id, effect.step_index, NOW)
            assert await q.insert_effect(effect)
    return effects


def finish(store: Store, org_id: str, effect_id: str, **changes: Any) -> Awaitable[Any]:
    """`Store.finish_effect` committing the effect with `COMMIT_RESULT` (or as `changes` say)."""
    kwargs: dict[str, Any] = {
        "target": "committed", "result_json": COMMIT_RESULT, "error": None,
        "now_us": FINISHED_US, "event_type": "effect_committed", "extra": {},
    }  # fmt: skip
    return store.finish_effect(Finish(org_id, effect_id, **(kwargs | changes)))


async def effect_events(store: Store, org_id: str, effect_id: str) -> list[tuple[str, str]]:
    """The (type, payload) of an effect's events, oldest first."""
    async with store.reader() as q:
        events = await q.list_events(org_id)
    return [(e.type, e.payload_json) for e in events if e.effect_id == effect_id]
