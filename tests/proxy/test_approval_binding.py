"""Approvals bind to arguments, and a key never approves its own call, on both stores
(docs/approvals.md, "What an approval approves", "Separation of duties").

Before: with a rule for two approvers, approver 1 approved with edited args and approver 2's
empty-body approve counted for them, so the call ran with args approver 2 never saw; an
approver's edit was not checked against the rules (an edit to a denied `prod` ran); an admin
key could approve its own IRREVERSIBLE call. Now each approval is for one exact argument set
(its hash is recorded with the decision); an approve that names no args after another
approver's edit, or that names a hash other than the call's current one, is refused (`409
approval_args_changed`); an edit passes the rules again; the key that made a call cannot
approve it unless the operator allows it (`allow_self_approval`).
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_policy_rules import call, code, set_rules, upstream_calls
from undolog.engine.changes import args_hash
from undolog_sdk.signature import canonical_json


@pytest.fixture
def proxy(proxy_factory: Any) -> ProxyHarness:
    """A proxy with the product's default: the key that made a call cannot approve it (the
    shared harness allows it, for tests that use one admin key for everything)."""
    harness: ProxyHarness = proxy_factory(allow_self_approval=False)
    return harness


TWO_FOR_DROPS = {"name": "two-for-drops", "tool": "delete_database", "action": "require",
                 "approvers": 2}  # fmt: skip


def ask(proxy: ProxyHarness, db: str, key: str | None = None) -> str:
    with proxy.client(key or proxy.agent_key) as agent:
        asked = call(agent, "delete_database", str(uuid.uuid4()), 1, db_name=db)
    assert asked.status_code == 202, asked.text
    return str(asked.json()["approval_id"])


def approve(c: httpx.Client, approval_id: str, **body: Any) -> httpx.Response:
    return c.post(f"/approvals/{approval_id}/approve", json=body or None)


def dropped(proxy: ProxyHarness) -> list[Any]:
    return [x["args"]["db_name"] for x in upstream_calls(proxy, "delete_database")]


@pytest.mark.security
def test_a_second_approver_cannot_run_the_firsts_edit_unseen(proxy: ProxyHarness) -> None:
    set_rules(proxy, TWO_FOR_DROPS)
    approval_id = ask(proxy, "scratch")
    edited = {"db_name": "prod"}
    with proxy.client(proxy.approver_key) as first, proxy.client() as second:
        partly = approve(first, approval_id, args=edited)
        assert partly.json()["execution"] == "awaiting_approvers", partly.text
        # The second approver's empty body approves what the agent asked for, which is not
        # what would run: refused, and nothing runs.
        blind = second.post(f"/approvals/{approval_id}/approve")
        assert blind.status_code == 409, blind.text
        assert code(blind) == "approval_args_changed"
        assert blind.json()["args_hash"] == args_hash(canonical_json(edited))
        assert dropped(proxy) == []
        card = second.get(f"/approvals/{approval_id}").json()
        assert (card["status"], card["approvals"]) == ("pending", 1)
        # Both shown: what was asked and what will run, with the hash to approve.
        assert card["arguments"] == {"db_name": "scratch"}
        assert card["approved_args"] == edited
        assert card["args_hash"] == args_hash(canonical_json(edited))
        assert card["requested_args_hash"] == args_hash(canonical_json({"db_name": "scratch"}))
        # A stale hash (the requested args') is refused the same way.
        stale = approve(second, approval_id, args_hash=card["requested_args_hash"])
        assert (stale.status_code, code(stale)) == (409, "approval_args_changed")
        done = approve(second, approval_id, args_hash=card["args_hash"])
        assert done.status_code == 200, done.text
        assert done.json()["execution"] == "committed"
        final = second.get(f"/approvals/{approval_id}").json()
    assert final["approved_by"] == ["key:approver", "key:admin"]
    assert dropped(proxy) == ["prod"]


@pytest.mark.security
def test_an_edit_starts_a_new_round_that_every_approver_decides(proxy: ProxyHarness) -> None:
    set_rules(proxy, TWO_FOR_DROPS)
    approval_id = ask(proxy, "scratch")
    with proxy.client(proxy.approver_key) as first, proxy.client() as second:
        assert approve(first, approval_id).json()["approvals"] == 1  # the requested args
        # The second approver edits: the first one's approval (of other args) no longer counts.
        edit = approve(second, approval_id, args={"db_name": "scratch-copy"})
        assert (edit.json()["execution"], edit.json()["approvals"]) == ("awaiting_approvers", 1)
        assert dropped(proxy) == []
        card = first.get(f"/approvals/{approval_id}").json()
        assert card["approved_by"] == ["key:admin"]
        done = approve(first, approval_id, args_hash=card["args_hash"])
        assert done.json()["execution"] == "committed", done.text
    assert dropped(proxy) == ["scratch-copy"]


@pytest.mark.security
def test_edited_args_that_a_deny_rule_matches_are_refused(proxy: ProxyHarness) -> None:
    set_rules(proxy, {"name": "never-prod", "tool": "delete_database",
                      "condition": 'db_name == "prod"', "action": "deny"})  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        denied = call(agent, "delete_database", str(uuid.uuid4()), 1, db_name="prod")
        assert (denied.status_code, code(denied)) == (403, "policy_denied")
    approval_id = ask(proxy, "scratch")
    with proxy.client(proxy.approver_key) as approver:
        edit = approve(approver, approval_id, args={"db_name": "prod"})
        assert (edit.status_code, code(edit)) == (403, "policy_denied"), edit.text
        assert edit.json()["rule"] == "never-prod"
        card = approver.get(f"/approvals/{approval_id}").json()
    assert (card["status"], card["approved_args"], card["approvals"]) == ("pending", None, 0)
    assert dropped(proxy) == []


@pytest.mark.security
def test_edited_args_that_a_stricter_rule_matches_need_its_approvers(proxy: ProxyHarness) -> None:
    set_rules(proxy, {"name": "two-for-prod", "tool": "delete_database",
                      "condition": 'db_name startswith "prod"', "action": "require",
                      "approvers": 2})  # fmt: skip
    approval_id = ask(proxy, "scratch")  # no rule: one approver
    with proxy.client(proxy.approver_key) as first, proxy.client() as second:
        edit = approve(first, approval_id, args={"db_name": "prod-1"})
        assert edit.status_code == 200, edit.text
        assert (edit.json()["execution"], edit.json()["approvers_required"]) == (
            "awaiting_approvers", 2,
        )  # fmt: skip
        assert dropped(proxy) == []
        card = second.get(f"/approvals/{approval_id}").json()
        assert (card["rule"], card["approvers_required"]) == ("two-for-prod", 2)
        done = approve(second, approval_id, args_hash=card["args_hash"])
        assert done.json()["execution"] == "committed", done.text
    assert dropped(proxy) == ["prod-1"]


@pytest.mark.security
def test_an_edit_that_no_rule_matches_keeps_the_approvers_the_call_needed(
    proxy: ProxyHarness,
) -> None:
    set_rules(proxy, {"name": "two-for-prod", "tool": "delete_database",
                      "condition": 'db_name startswith "prod"', "action": "require",
                      "approvers": 2})  # fmt: skip
    approval_id = ask(proxy, "prod-1")
    with proxy.client(proxy.approver_key) as first:
        edit = approve(first, approval_id, args={"db_name": "scratch"})
        assert (edit.json()["execution"], edit.json()["approvers_required"]) == (
            "awaiting_approvers", 2,
        )  # fmt: skip
    assert dropped(proxy) == []


@pytest.mark.security
def test_an_admin_cannot_approve_its_own_call(proxy: ProxyHarness) -> None:
    approval_id = ask(proxy, "scratch", key=proxy.api_key)  # the admin key makes the call
    with proxy.client() as admin, proxy.client(proxy.approver_key) as approver:
        own = admin.post(f"/approvals/{approval_id}/approve")
        assert (own.status_code, code(own)) == (403, "forbidden"), own.text
        assert dropped(proxy) == []
        other = approver.post(f"/approvals/{approval_id}/approve")
        assert other.json()["execution"] == "committed", other.text
    assert dropped(proxy) == ["scratch"]


def test_a_single_person_setup_may_allow_approving_ones_own_call(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory(allow_self_approval=True)
    approval_id = ask(proxy, "scratch", key=proxy.api_key)
    with proxy.client() as admin:
        own = admin.post(f"/approvals/{approval_id}/approve")
        assert own.json()["execution"] == "committed", own.text
    # Several approvers never count the maker, even then.
    set_rules(proxy, TWO_FOR_DROPS)
    approval_id = ask(proxy, "scratch-2", key=proxy.api_key)
    with proxy.client() as admin:
        own = admin.post(f"/approvals/{approval_id}/approve")
        assert (own.status_code, code(own)) == (403, "forbidden"), own.text
    assert dropped(proxy) == ["scratch"]
