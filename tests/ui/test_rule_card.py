"""The approval card in real Chromium shows the policy rule behind an approval, its approvers
so far, and what an approver changed in the arguments (docs/approvals.md)."""

from __future__ import annotations

import uuid

from playwright.sync_api import expect

from tests.ui.conftest import Dashboard

TOOL_CALL = "/mcp/tool_call"


def test_the_card_shows_the_rule_the_approvers_and_the_changed_args(dashboard: Dashboard) -> None:
    proxy = dashboard.proxy
    rule = {"name": "mail-needs-two", "tool": "send_email", "action": "require", "approvers": 2}
    with proxy.client() as admin:
        assert admin.put("/policy/rules", json={"rules": [rule]}).status_code == 200
    body = {"session_id": str(uuid.uuid4()), "tool_name": "send_email", "step_index": 1,
            "args": {"to": "x@elsewhere.org", "subject": "hi"}}  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        asked = agent.post(TOOL_CALL, json=body)
    assert asked.status_code == 202, asked.text
    approval_id = asked.json()["approval_id"]

    page = dashboard.page
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"[data-approval='{approval_id}']")
    card.wait_for()
    assert card.locator(".rule").inner_text() == "mail-needs-two"
    assert card.locator(".approvers").inner_text().startswith("0 of 2")
    dashboard.screenshot("approval-rule-pending")

    changed = {"args": {"to": "x@ourcompany.com", "subject": "hi", "cc": "boss"}}
    with proxy.client(proxy.approver_key) as approver, proxy.client() as admin:
        first = approver.post(f"/approvals/{approval_id}/approve", json=changed)
        assert first.json()["execution"] == "awaiting_approvers", first.text
        # The edit started a new round: the second approver approves what will run now.
        runs = admin.get(f"/approvals/{approval_id}").json()["args_hash"]
        second = admin.post(f"/approvals/{approval_id}/approve", json={"args_hash": runs})
        assert second.json()["execution"] == "committed", second.text

    dashboard.go("#/approvals/approved")
    decided = page.locator(f"#approval-list [data-approval='{approval_id}']")
    # The list of decided approvals replaces the pending one when its fetch answers: until
    # then the card found may still be the pending one ("0 of 2").
    expect(decided.locator(".approvers")).to_contain_text("key:approver, key:admin")
    assert decided.locator(".rule").inner_text() == "mail-needs-two"
    diff = decided.locator(".args-diff")
    assert diff.locator("li.added").inner_text() == '+ cc: "boss"'
    assert diff.locator("li.changed").inner_text() == (
        '~ to: "x@elsewhere.org" → "x@ourcompany.com"'
    )
    dashboard.screenshot("approval-rule-changed")


def test_an_open_card_counts_a_partial_approval_made_elsewhere(dashboard: Dashboard) -> None:
    """The first of two approvals, made by another approver, reaches an open approvals page
    (the `approval_partially_approved` event): its card says "1 of 2" without a reload. The
    signed-in admin approving first sees, on the card of its decision, that others must still
    approve (not "the agent runs it")."""
    proxy, page = dashboard.proxy, dashboard.page
    rule = {"name": "mail-needs-two", "tool": "send_email", "action": "require", "approvers": 2}
    with proxy.client() as admin:
        assert admin.put("/policy/rules", json={"rules": [rule]}).status_code == 200
    body = {"session_id": str(uuid.uuid4()), "tool_name": "send_email", "step_index": 1,
            "args": {"to": "x@elsewhere.org", "subject": "hi"}}  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        approval_id = agent.post(TOOL_CALL, json=body).json()["approval_id"]
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"#approval-list [data-approval='{approval_id}']")
    card.locator(".approvers").filter(has_text="0 of 2").wait_for()

    with proxy.client(proxy.approver_key) as approver:
        first = approver.post(f"/approvals/{approval_id}/approve")
        assert first.json()["execution"] == "awaiting_approvers", first.text
    card.locator(".approvers").filter(has_text="1 of 2 (key:approver)").wait_for()
    dashboard.screenshot("approval-partial-live")

    with proxy.client(proxy.agent_key) as agent:
        other = agent.post(TOOL_CALL, json={**body, "step_index": 2}).json()["approval_id"]
    mine = page.locator(f"#approval-list [data-approval='{other}']")
    mine.get_by_role("button", name="Approve").click()
    decided = page.locator(f"#decided [data-decided='{other}']")
    decided.get_by_text("Approved: 1 of 2 approvers so far").wait_for()
