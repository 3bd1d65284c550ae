"""The store contract for policy rules and the approval's columns of migration 13, on both
dialects (the parametrised `store` fixture)."""

from __future__ import annotations

from dataclasses import replace

from tests.store.contract_helpers import (
    add_effect,
    add_org,
    make_approval,
    make_effect,
    new_org,
)
from undolog.store import Store
from undolog.store.records import PolicyRecord


async def test_an_orgs_rules_are_replaced_whole_and_read_back(store: Store) -> None:
    async with store.reader() as q:
        assert await q.get_policy("org-p") is None
    first = PolicyRecord("org-p", '[{"name":"a"}]', 10, "key:admin")
    second = PolicyRecord("org-p", "[]", 20, "config")
    async with store.transaction() as q:
        await q.put_policy(first)
    async with store.transaction() as q:
        await q.put_policy(second)
    async with store.reader() as q:
        assert await q.get_policy("org-p") == second
        assert await q.get_policy("org-other") is None


async def test_an_approval_keeps_its_rule_approvers_and_changed_args(store: Store) -> None:
    org_id = new_org()
    await add_org(store, org_id)
    effect = make_effect(org_id, state="awaiting_approval")
    await add_effect(store, effect)
    approval = make_approval(effect, rule="r", approvers_required=2, requested_by_key_id="key_1")
    async with store.transaction() as q:
        await q.insert_approval(approval)
    async with store.transaction() as q:
        changed = await q.update_approval(
            effect.org_id, approval.approval_id, expect_status="pending",
            approved_by='[{"key_id":"k","by":"key:b"}]', approved_args='{"x":2}',
        )  # fmt: skip
        assert changed
    async with store.reader() as q:
        stored = await q.get_approval(effect.org_id, approval.approval_id)
    assert stored == replace(
        approval, approved_by_json='[{"key_id":"k","by":"key:b"}]', approved_args_json='{"x":2}'
    )
