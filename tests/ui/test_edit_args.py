"""Approving with changed arguments from the dashboard, in real Chromium against a real proxy
and the demo tools (docs/dashboard.md, "Approve with changes"): the JSON editor, its checks
before anything is sent, the confirmation of an irreversible call showing the edited
arguments, and no editor where the API cannot take one (an SDK-executed call)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.proxy.conftest import ProxyHarness
from tests.ui.conftest import Dashboard

TOOL_CALL = "/mcp/tool_call"


def ask(proxy: ProxyHarness, tool: str, args: dict[str, Any], mode: str = "proxy") -> str:
    body = {"session_id": str(uuid.uuid4()), "tool_name": tool, "step_index": 1,
            "args": args, "mode": mode}  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        asked = agent.post(TOOL_CALL, json=body)
    assert asked.status_code == 202, asked.text
    approval_id: str = asked.json()["approval_id"]
    return approval_id


def approval(proxy: ProxyHarness, approval_id: str) -> dict[str, Any]:
    with proxy.client() as c:
        body: dict[str, Any] = c.get(f"/approvals/{approval_id}").json()
        return body


def upstream_state(proxy: ProxyHarness) -> dict[str, Any]:
    with proxy.upstream() as c:
        state: dict[str, Any] = c.get("/state", params={"org": proxy.org_id}).json()
        return state


def test_an_approver_edits_the_amount_and_the_tool_runs_with_it(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    rule = {"name": "transfers-need-a-person", "tool": "transfer_funds", "action": "require"}
    with proxy.client() as admin:
        assert admin.put("/policy/rules", json={"rules": [rule]}).status_code == 200
    with proxy.upstream() as up:
        for account in ("ops", "vendor"):
            put = up.put(
                f"/balances/{account}", params={"org": proxy.org_id}, json={"balance": 1000}
            )
            assert put.status_code == 200, put.text
    requested = {"from_account": "ops", "to_account": "vendor", "amount": 500}
    approval_id = ask(proxy, "transfer_funds", requested)

    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"#approval-list [data-approval='{approval_id}']")
    card.get_by_role("button", name="Edit arguments").click()
    editor = card.get_by_label("Arguments to approve (JSON)")
    assert json.loads(editor.input_value()) == requested  # prefilled, pretty
    assert "\n" in editor.input_value()
    editor.fill(json.dumps({**requested, "amount": 50}, indent=2))
    dashboard.screenshot("edit-args-editing")
    card.get_by_role("button", name="Approve").click()

    page.locator(f"[data-decided='{approval_id}']").get_by_text("committed").wait_for()
    state = upstream_state(proxy)
    assert state["balances"] == {"ops": 950, "vendor": 1050}  # the upstream saw 50, not 500
    assert [t["amount"] for t in state["transfers"].values()] == [50]
    decided = approval(proxy, approval_id)
    assert decided["status"] == "approved"
    assert decided["args_diff"]["changed"] == {"amount": {"from": 500, "to": 50}}

    dashboard.go("#/approvals/approved")
    shown = page.locator(f"#approval-list [data-approval='{approval_id}']")
    assert shown.locator(".args-diff li.changed").inner_text() == "~ amount: 500 → 50"
    dashboard.screenshot("edit-args-decided")


@pytest.mark.security
def test_what_is_not_a_json_object_is_refused_inline_and_nothing_is_sent(
    dashboard: Dashboard,
) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    approval_id = ask(proxy, "delete_database", {"db_name": "customers"})
    decisions: list[str] = []
    page.on("request", lambda r: decisions.append(r.url) if r.method == "POST" else None)
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"#approval-list [data-approval='{approval_id}']")
    card.get_by_role("button", name="Edit arguments").click()
    editor = card.get_by_label("Arguments to approve (JSON)")
    error = card.locator(".args-error")
    for text, says in (
        ('{"db_name": "x"', "not valid JSON"),
        ('["db_name"]', "must be a JSON object"),
        ("null", "must be a JSON object"),
        ('{"n": 12345678901234567890}', "too large"),
    ):
        editor.fill(text)
        card.get_by_role("button", name="Approve").click()
        error.filter(has_text=says).wait_for()
        assert editor.get_attribute("aria-invalid") == "true"
        assert not page.locator("#approve-dialog").is_visible()  # refused before asking
    dashboard.screenshot("edit-args-invalid")
    assert not [u for u in decisions if "/approvals/" in u]  # nothing sent
    assert approval(proxy, approval_id)["status"] == "pending"
    assert proxy.counters("delete_database") == {}


def test_an_irreversible_call_confirms_the_edited_arguments(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    approval_id = ask(proxy, "delete_database", {"db_name": "customers"})
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"#approval-list [data-approval='{approval_id}']")
    card.get_by_role("button", name="Edit arguments").click()
    card.get_by_label("Arguments to approve (JSON)").fill('{"db_name": "customers-copy"}')
    card.get_by_role("button", name="Approve").click()
    dialog = page.locator("#approve-dialog")
    dialog.get_by_text("UndoLog cannot undo delete_database").wait_for()
    assert json.loads(dialog.locator("#approve-args").inner_text()) == {"db_name": "customers-copy"}
    assert "changed" in dialog.locator("#approve-changed").inner_text()
    assert '"customers"' in dialog.locator("#approve-changed").inner_text()  # what was asked
    dashboard.screenshot("edit-args-confirm")
    dialog.get_by_role("button", name="Approve and run").click()
    page.locator(f"[data-decided='{approval_id}']").get_by_text("committed").wait_for()
    assert upstream_state(proxy)["deleted_databases"] == ["customers-copy"]

    # Unchanged arguments: the dialog says nothing was changed, and no `args` is sent.
    other = ask(proxy, "delete_database", {"db_name": "logs"})
    card = page.locator(f"#approval-list [data-approval='{other}']")
    card.get_by_role("button", name="Edit arguments").click()
    card.get_by_role("button", name="Approve").click()
    dialog.get_by_text("UndoLog cannot undo delete_database").wait_for()
    assert not dialog.locator("#approve-changed").is_visible()
    dialog.get_by_role("button", name="Approve and run").click()
    page.locator(f"[data-decided='{other}']").get_by_text("committed").wait_for()
    assert approval(proxy, other)["args_diff"] is None


def test_an_sdk_executed_call_offers_no_editor(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    sdk = ask(proxy, "delete_database", {"db_name": "a"}, mode="sdk")
    proxied = ask(proxy, "delete_database", {"db_name": "b"})
    dashboard.sign_in()
    dashboard.go("#/approvals")
    page.locator(f"#approval-list [data-approval='{proxied}'] button.edit-args").wait_for()
    sdk_card = page.locator(f"#approval-list [data-approval='{sdk}']")
    sdk_card.wait_for()
    assert sdk_card.locator("button.edit-args").count() == 0
    assert "runs the agent's own arguments" in sdk_card.locator(".no-edit").inner_text()


def test_the_local_approved_card_shows_the_diff_right_away(dashboard: Dashboard) -> None:
    """The card the approver sees right after approving with changes shows requested →
    approved, as the history view does (it showed none before); unchanged, it shows none."""
    proxy, page = dashboard.proxy, dashboard.page
    requested = {"db_name": "customers", "keep_backup": True}
    approval_id = ask(proxy, "delete_database", requested)
    same = ask(proxy, "delete_database", {"db_name": "logs"})
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator(f"#approval-list [data-approval='{approval_id}']")
    card.get_by_role("button", name="Edit arguments").click()
    card.get_by_label("Arguments to approve (JSON)").fill(
        json.dumps({"db_name": "customers-copy", "dry_run": False})
    )
    card.get_by_role("button", name="Approve").click()
    page.locator("#approve-dialog").get_by_role("button", name="Approve and run").click()
    decided = page.locator(f"#decided [data-decided='{approval_id}']")
    decided.get_by_text("committed").wait_for()
    items = decided.locator(".args-diff li")
    assert sorted(items.all_inner_texts()) == sorted(
        ['~ db_name: "customers" → "customers-copy"', "+ dry_run: false",
         "\u2212 keep_backup: true"]
    )  # fmt: skip
    assert decided.locator(".args-diff summary").inner_text() == "Changed by the approver"
    # The same as the history view, which reads the server's record.
    server = approval(proxy, approval_id)["args_diff"]
    assert server["changed"] == {"db_name": {"from": "customers", "to": "customers-copy"}}
    assert (server["added"], server["removed"]) == ({"dry_run": False}, {"keep_backup": True})
    dashboard.screenshot("edit-args-decided-local")

    plain = page.locator(f"#approval-list [data-approval='{same}']")
    plain.get_by_role("button", name="Approve").click()
    page.locator("#approve-dialog").get_by_role("button", name="Approve and run").click()
    done = page.locator(f"#decided [data-decided='{same}']")
    done.get_by_text("committed").wait_for()
    assert done.locator(".args-diff").count() == 0
