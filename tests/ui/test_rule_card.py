"""The approval card in real Chromium shows the policy rule behind an approval, its approvers
so far, and what an approver changed in the arguments (docs/approvals.md)."""

from __future__ import annotations

import uuid

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
        second = admin.post(f"/approvals/{approval_id}/approve")
        assert second.json()["execution"] == "committed", second.text

    dashboard.go("#/approvals/approved")
    decided = page.locator(f"#approval-list [data-approval='{approval_id}']")
    decided.wait_for()
    assert decided.locator(".rule").inner_text() == "mail-needs-two"
    assert "key:approver, key:admin" in decided.locator(".approvers").inner_text()
    diff = decided.locator(".args-diff")
    assert diff.locator("li.added").inner_text() == '+ cc: "boss"'
    assert diff.locator("li.changed").inner_text() == (
        '~ to: "x@elsewhere.org" → "x@ourcompany.com"'
    )
    dashboard.screenshot("approval-rule-changed")
