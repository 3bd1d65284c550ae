"""The dashboard in real Chromium against a real proxy: sign in, approvals appearing live,
approve and reject, rollback step by step, failed compensations, narrow screens, restarts."""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer
from tests.ui.conftest import UI_SECRET, Dashboard, open_dashboard
from undolog.config import Settings
from undolog.proxy.ui_auth import COOKIE_NAME

TOOL_CALL = "/mcp/tool_call"


def agent_call(
    proxy: ProxyHarness, session: str, tool: str, args: dict[str, Any], step: int
) -> httpx.Response:
    with proxy.client() as c:
        return c.post(
            TOOL_CALL,
            json={"session_id": session, "tool_name": tool, "step_index": step, "args": args},
        )


def approval_card(dashboard: Dashboard, tool: str) -> Any:
    """The card of `tool`'s approval in the list the page shows (pending or a history filter)."""
    return dashboard.page.locator("#approval-list article.approval").filter(has_text=tool)


def test_signing_in_keeps_only_an_httponly_cookie_and_signing_out_works(
    dashboard: Dashboard,
) -> None:
    page = dashboard.page
    dashboard.open()
    page.get_by_role("heading", name="Sign in").wait_for()
    dashboard.screenshot("sign-in")
    dashboard.sign_in()
    page.get_by_role("heading", name="Overview").wait_for()

    cookies = page.context.cookies()
    assert [c["name"] for c in cookies] == [COOKIE_NAME]
    assert cookies[0]["httpOnly"] is True
    assert cookies[0]["sameSite"] == "Strict"
    assert dashboard.proxy.api_key not in cookies[0]["value"]
    assert page.evaluate("document.cookie") == ""  # HttpOnly: the page's script cannot read it
    stored = page.evaluate("JSON.stringify([localStorage, sessionStorage])")
    assert dashboard.proxy.api_key not in stored
    assert dashboard.proxy.api_key not in page.url
    assert page.locator("#api-key").input_value() == ""

    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("heading", name="Sign in").wait_for()
    page.get_by_text("Signed out.").wait_for()
    assert page.context.cookies() == []
    page.reload()
    page.get_by_role("heading", name="Sign in").wait_for()


def test_overview_shows_counts_and_follows_new_calls(dashboard: Dashboard) -> None:
    session = str(uuid.uuid4())
    assert agent_call(dashboard.proxy, session, "echo", {"n": 1}, 1).status_code == 200
    assert agent_call(dashboard.proxy, session, "echo", {"n": 1}, 1).json()["status"] == "replayed"
    dashboard.sign_in()
    page = dashboard.page
    page.locator("[data-count='calls'] .value").filter(has_text="1").wait_for()
    page.locator("[data-count='replays'] .value").filter(has_text="1").wait_for()
    gated = agent_call(dashboard.proxy, session, "delete_database", {"db_name": "x"}, 2)
    assert gated.status_code == 202
    page.locator("[data-count='pending_approvals'] .value").filter(has_text="1").wait_for()
    page.locator("[data-count='calls'] .value").filter(has_text="2").wait_for()
    page.locator("#pending-badge").filter(has_text="1").wait_for()
    dashboard.screenshot("overview")


def test_an_irreversible_call_appears_live_and_approving_it_shows_the_result(
    dashboard: Dashboard,
) -> None:
    page = dashboard.page
    dashboard.sign_in()
    dashboard.go("#/approvals")
    page.get_by_text("No pending approvals.").wait_for()

    session = str(uuid.uuid4())
    args = {"db_name": "customers", "reason": "cleanup"}
    first = agent_call(dashboard.proxy, session, "delete_database", args, 1)
    assert first.status_code == 202, first.text

    card = approval_card(dashboard, "delete_database")
    card.wait_for()  # appeared without a reload
    assert card.get_by_text("cannot be undone").is_visible()
    assert json.loads(card.locator("pre.json").inner_text()) == args
    assert session in card.inner_text()
    assert card.locator(".left").inner_text() not in ("", "no timeout")
    assert "ago" in card.locator(".age").inner_text()
    dashboard.screenshot("approvals-pending")

    card.get_by_role("button", name="Approve").click()
    page.locator("#approve-dialog").get_by_role("button", name="Approve and run").click()
    decided = page.locator("[data-decided]").filter(has_text="delete_database")
    decided.get_by_text("committed").wait_for()
    result = json.loads(decided.locator("pre.result").inner_text())
    assert result["success"] is True
    page.get_by_text("No pending approvals.").wait_for()
    dashboard.screenshot("approvals-approved")

    retry = agent_call(dashboard.proxy, session, "delete_database", args, 1)
    assert retry.json()["status"] == "replayed"

    dashboard.go("#/approvals/approved")
    history = page.locator("#approval-list article.approval").filter(has_text="delete_database")
    history.wait_for()
    assert "key:admin" in history.inner_text()  # the signed-in key, never client text


def test_rejecting_with_a_reason_and_a_decision_made_elsewhere_updates_live(
    dashboard: Dashboard,
) -> None:
    page = dashboard.page
    dashboard.sign_in()
    dashboard.go("#/approvals")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    agent_call(dashboard.proxy, first, "publish_to_production", {"artifact": "web-1.2.3"}, 1)
    agent_call(dashboard.proxy, second, "delete_database", {"db_name": "orders"}, 1)
    publish = approval_card(dashboard, "publish_to_production")
    delete = approval_card(dashboard, "delete_database")
    delete.wait_for()
    publish.wait_for()
    cards = page.locator("#approval-list article.approval h2").all_inner_texts()
    assert cards == ["delete_database", "publish_to_production"]  # newest first

    publish.get_by_label("Reason (optional)").fill("not on a Friday")
    publish.get_by_role("button", name="Reject").click()
    page.locator("[data-decided][data-verdict='reject']").get_by_text("not on a Friday").wait_for()
    retry = agent_call(
        dashboard.proxy, first, "publish_to_production", {"artifact": "web-1.2.3"}, 1
    )
    assert retry.json()["code"] == "approval_rejected"

    # Decided elsewhere (the CLI, another tab): the card goes away without a reload.
    with dashboard.proxy.client() as c:
        approval_id = c.get("/approvals").json()[0]["id"]
        c.post(f"/approvals/{approval_id}/approve").raise_for_status()
    delete.wait_for(state="detached")
    page.get_by_text("No pending approvals.").wait_for()

    dashboard.go("#/approvals/rejected")
    rejected = approval_card(dashboard, "publish_to_production")
    rejected.locator(".reason").filter(has_text="not on a Friday").wait_for()
    dashboard.screenshot("approvals-rejected")


def test_rolling_back_a_session_turns_its_entries_compensated_step_by_step(
    dashboard: Dashboard,
) -> None:
    proxy = dashboard.proxy
    session = str(uuid.uuid4())
    calls = [
        ("send_email", {"to": "ada@example.com", "subject": "hi"}),
        ("create_record", {"table": "users", "data": {"name": "Ada"}}),
        ("transfer_funds", {"from_account": "a", "to_account": "b", "amount": 5}),
    ]
    for step, (tool, args) in enumerate(calls, start=1):
        response = agent_call(proxy, session, tool, args, step)
        assert response.status_code == 200, response.text
    assert agent_call(proxy, session, "send_email", calls[0][1], 1).json()["status"] == "replayed"

    page = dashboard.page
    dashboard.sign_in()
    dashboard.go("#/sessions")
    row = page.locator(f"#sessions-table tr[data-session='{session}']")
    assert row.get_attribute("data-state") == "active"
    dashboard.screenshot("sessions")
    row.get_by_role("link").click()
    effects = page.locator("#effects-table tbody tr")
    effects.nth(2).wait_for()
    assert [r.get_attribute("data-step") for r in effects.all()] == ["1", "2", "3"]
    assert effects.nth(0).locator("td").nth(6).inner_text() == "1"  # one replay
    undo = page.locator("#undo-table tbody tr")
    assert [r.get_attribute("data-state") for r in undo.all()] == ["pending"] * 3
    dashboard.screenshot("session-before-rollback")

    page.get_by_role("button", name="Roll back").click()
    dialog = page.locator("#confirm-dialog")
    dialog.get_by_role("button", name="Cancel").click()
    assert undo.first.get_attribute("data-state") == "pending"
    page.get_by_role("button", name="Roll back").click()
    dialog.get_by_role("button", name="Roll back").click()

    page.locator("#session-state .state-compensated").wait_for()
    page.locator("#undo-table tbody tr[data-state='compensated']").nth(2).wait_for()
    assert [r.get_attribute("data-state") for r in effects.all()] == ["compensated"] * 3
    assert page.get_by_role("button", name="Roll back").count() == 0
    # The unwinding as it happened, newest first on the page: LIFO order of the compensations.
    completed = page.locator("#activity li[data-type='compensation_completed']")
    completed.nth(2).wait_for()
    names = ("delete_record", "reverse_transfer", "undo_send_email")
    oldest_first = [
        next(n for n in names if n in text) for text in reversed(completed.all_inner_texts())
    ]
    assert oldest_first == ["reverse_transfer", "delete_record", "undo_send_email"]
    stray = "v => [...v.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent.trim())"
    assert "null" not in page.locator("#view").evaluate(stray)  # no placeholder leaks as text
    dashboard.screenshot("session-compensated")


def test_a_failed_compensation_offers_retry_and_resolve(dashboard: Dashboard) -> None:
    proxy = dashboard.proxy
    with proxy.client() as c:
        c.put("/tools/send_email", json={"tier": "compensable", "compensation": {
            "fn_name": "undo_send_email", "max_retries": 1, "retry_backoff_ms": 10,
            "args": {"fail_times": 1000}}}).raise_for_status()  # fmt: skip
    session = str(uuid.uuid4())
    agent_call(proxy, session, "create_record", {"table": "t", "data": {}}, 1).raise_for_status()
    agent_call(proxy, session, "send_email", {"to": "b@example.com", "subject": "x"}, 2)
    # The rollback's 502 (compensation_failed) is logged by Chromium as a failed resource.
    dashboard.console.allow(r"status of 502")

    page = dashboard.page
    dashboard.sign_in()
    dashboard.go(f"#/sessions/{session}")
    page.get_by_role("button", name="Roll back").click()
    page.locator("#confirm-dialog").get_by_role("button", name="Roll back").click()
    page.locator("#session-state .state-compensation_failed").wait_for()
    failed = page.locator("#undo-table tr[data-state='failed']")
    assert failed.get_by_role("button", name="Retry").is_visible()
    page.locator("#flash").filter(has_text="Rollback stopped").wait_for()
    dashboard.screenshot("session-compensation-failed")

    failed.get_by_role("button", name="Retry").click()  # fails again: still offered
    page.locator("#flash").filter(has_text="Rollback stopped").wait_for()
    failed.get_by_role("button", name="Resolve").wait_for()
    failed.get_by_role("button", name="Resolve").click()
    page.get_by_label("Note").fill("unsent by hand")
    page.locator("#resolve-dialog").get_by_role("button", name="Resolve").click()
    page.locator("#undo-table tr[data-state='resolved']").wait_for()
    page.get_by_role("button", name="Continue rollback").click()
    page.locator("#confirm-dialog").get_by_role("button", name="Roll back").click()
    page.locator("#session-state .state-compensated").wait_for()
    states = page.locator("#undo-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.state)")
    assert states == ["resolved", "compensated"]


def test_works_on_a_narrow_screen_with_the_keyboard(browser: Any, ui_proxy: ProxyHarness) -> None:
    for dashboard in open_dashboard(browser, ui_proxy):
        page = dashboard.page
        page.set_viewport_size({"width": 400, "height": 800})
        dashboard.sign_in()
        session = str(uuid.uuid4())
        agent_call(ui_proxy, session, "echo", {"n": 1}, 1)
        agent_call(ui_proxy, session, "delete_database", {"db_name": "tiny"}, 2)
        dashboard.go("#/approvals")
        card = approval_card(dashboard, "delete_database")
        card.wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= 400
        dashboard.screenshot("approvals-narrow")

        # Keyboard only: type a reason, Tab to Approve, press Enter.
        card.get_by_label("Reason (optional)").focus()
        page.keyboard.type("fine by me")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Approve"
        page.keyboard.press("Enter")
        # The confirmation opens on Cancel (the safe choice): Tab to "Approve and run".
        page.locator("#approve-dialog[open]").wait_for()
        assert page.evaluate("document.activeElement.textContent") == "Cancel"
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Approve and run"
        page.keyboard.press("Enter")
        page.locator("[data-decided]").get_by_text("committed").wait_for()

        dashboard.go(f"#/sessions/{session}")
        page.locator("#effects-table").wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= 400
        dashboard.screenshot("session-narrow")
        for button in page.locator("button:visible").all():
            button.focus()
            assert button.evaluate("b => document.activeElement === b")


@pytest.mark.slow
def test_the_page_reconnects_and_resumes_after_the_server_restarts(
    browser: Any, store_url: str, demo_upstream: ThreadServer, tmp_path: Path
) -> None:
    org_id, key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
    config = write_org_config(tmp_path / "org.toml", org_id, key)
    env = {"UNDOLOG_UI_SECRET": UI_SECRET}
    first = spawn_proxy(store_url, demo_upstream.url, config, **env)
    servers = [first]
    try:
        proxy = ProxyHarness(first.url, demo_upstream.url, store_url, org_id, key, Settings())
        proxy.register_demo_tools()
        for dashboard in open_dashboard(browser, proxy):
            # While the server is down, Chromium logs the refused reconnections.
            dashboard.console.allow(r"net::ERR_|status of 50[23]")
            page = dashboard.page
            dashboard.sign_in()
            dashboard.go("#/approvals")
            page.get_by_text("No pending approvals.").wait_for()

            first.kill()  # kill -9: the stream just stops
            page.locator("#live[data-state='down']").wait_for()
            second = ProcessServer(first.args, first.env, first.port).start()
            servers.append(second)
            # An event written before the page is back: it must arrive on resume.
            agent_call(proxy, str(uuid.uuid4()), "delete_database", {"db_name": "restart"}, 1)
            page.locator("#live[data-state='live']").wait_for(timeout=30_000)
            approval_card(dashboard, "delete_database").wait_for()
            assert page.locator("#org-id").inner_text() == org_id  # still signed in
    finally:
        for server in servers:
            server.stop()
