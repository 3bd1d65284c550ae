"""The dashboard's confirmation before approving an irreversible call, who asked and the
session's recent calls on each approval, searching, filtering and paging sessions and
approvals, and recent events loaded from history: real Chromium against a real proxy."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.ui.conftest import Dashboard

expect = pytest.importorskip("playwright.sync_api").expect

TOOL_CALL = "/mcp/tool_call"


def call(c: httpx.Client, session: str, tool: str, args: dict[str, Any], step: int) -> Any:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
    response = c.post(TOOL_CALL, json=body)
    assert response.status_code in (200, 202), response.text
    return response.json()


def approval_status(proxy: ProxyHarness, approval_id: str) -> str:
    with proxy.client() as c:
        status: str = c.get(f"/approvals/{approval_id}").json()["status"]
        return status


def test_approving_an_irreversible_call_asks_first_and_cancel_keeps_it_pending(
    dashboard: Dashboard,
) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        pending = call(agent, session, "delete_database", {"db_name": "customers"}, 1)
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator("#approval-list article.approval").filter(has_text="delete_database")
    dialog = page.locator("#approve-dialog")

    card.get_by_role("button", name="Approve").click()
    dialog.get_by_text("UndoLog cannot undo delete_database").wait_for()
    assert '"db_name": "customers"' in dialog.locator("#approve-args").inner_text()
    assert dialog.locator("#approve-tool").inner_text() == "delete_database"
    dashboard.screenshot("approve-confirm")
    dialog.get_by_role("button", name="Cancel").click()
    page.locator("#flash").filter(has_text="delete_database is still pending").wait_for()
    assert not dialog.is_visible()
    assert card.is_visible()
    assert approval_status(proxy, pending["approval_id"]) == "pending"
    assert proxy.counters("delete_database") == {}  # nothing ran

    card.get_by_role("button", name="Approve").click()
    dialog.get_by_role("button", name="Approve and run").click()
    page.locator("[data-decided]").get_by_text("committed").wait_for()
    assert approval_status(proxy, pending["approval_id"]) == "approved"


def test_a_card_shows_who_asked_and_the_sessions_recent_calls(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        call(agent, session, "echo", {"n": 1}, 1)
        call(agent, session, "send_email", {"to": "ada@example.com", "subject": "hi"}, 2)
        call(agent, session, "delete_database", {"db_name": "x"}, 3)
    dashboard.sign_in()
    dashboard.go("#/approvals")
    card = page.locator("#approval-list article.approval").filter(has_text="delete_database")
    card.wait_for()
    assert card.locator(".requested-by").inner_text() == "key:agent"
    assert proxy.agent_key not in card.inner_text()  # the name, never the secret
    calls = card.locator(".recent .calls li")
    calls.nth(2).wait_for()
    texts = calls.all_inner_texts()
    assert [t.split(" · ")[1].split(" ")[0] for t in texts] == [
        "delete_database",
        "send_email",
        "echo",
    ]
    assert "(this call)" in texts[0]
    assert "committed" in texts[1]
    dashboard.screenshot("approval-card-recent-calls")


def test_sessions_are_searched_filtered_and_paged(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    many = [str(uuid.uuid4()) for _ in range(23)]
    mailing = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent, proxy.client() as admin:
        for session in many:
            call(agent, session, "echo", {"n": 1}, 1)
        call(admin, mailing, "send_email", {"to": "a@example.com", "subject": "s"}, 1)
        admin.post(f"/sessions/{many[0]}/complete").raise_for_status()
    dashboard.sign_in()
    dashboard.go("#/sessions")
    rows = page.locator("#sessions-table tbody tr")
    rows.nth(19).wait_for()
    first_page = rows.evaluate_all("rs => rs.map(r => r.dataset.session)")
    assert len(first_page) == 20
    assert first_page[0] == many[0]  # the latest update first: the completed one
    dashboard.screenshot("sessions-page-1")

    page.get_by_role("link", name="Next page").click()
    page.get_by_role("link", name="Previous page").wait_for()
    rows.first.wait_for()
    second_page = rows.evaluate_all("rs => rs.map(r => r.dataset.session)")
    assert len(second_page) == 4
    assert set(first_page) | set(second_page) == {*many, mailing}
    assert page.get_by_role("link", name="Next page").count() == 0
    page.get_by_role("link", name="Previous page").click()
    page.get_by_role("link", name="Next page").wait_for()
    assert rows.evaluate_all("rs => rs.map(r => r.dataset.session)") == first_page

    page.get_by_label("Search sessions").fill("send_email")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    page.locator(f"#sessions-table tr[data-session='{mailing}']").wait_for()
    assert rows.first.locator(".created-by").inner_text() == "key:admin"
    assert "q=send_email" in page.url  # the search survives a reload
    page.reload()
    page.locator(f"#sessions-table tr[data-session='{mailing}']").wait_for()
    assert page.get_by_label("Search sessions").input_value() == "send_email"

    page.get_by_label("Search sessions").fill("")
    page.get_by_label("State").select_option("completed")
    page.get_by_role("button", name="Search").click()
    expect(rows).to_have_count(1)
    page.locator(f"#sessions-table tr[data-session='{many[0]}']").wait_for()
    page.get_by_label("Search sessions").fill("no-such-session")
    page.get_by_role("button", name="Search").click()
    page.get_by_text("No sessions match.").wait_for()


def test_approvals_are_filtered_by_tool_and_paged(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    with proxy.client(proxy.agent_key) as agent:
        for n in range(21):
            call(agent, str(uuid.uuid4()), "delete_database", {"db_name": f"db{n}"}, 1)
        call(agent, str(uuid.uuid4()), "publish_to_production", {"artifact": "web"}, 1)
    dashboard.sign_in()
    dashboard.go("#/approvals")
    cards = page.locator("#approval-list article.approval")
    cards.nth(19).wait_for()
    assert cards.count() == 20
    page.get_by_label("Tool").select_option("publish_to_production")
    page.locator("#approval-list[data-key='pending|publish_to_production|']").wait_for()
    assert cards.all_inner_texts()[0].startswith("publish_to_production")
    assert cards.count() == 1
    page.get_by_label("Tool").select_option("delete_database")
    page.get_by_role("link", name="Next page").click()
    page.get_by_role("link", name="Previous page").wait_for()
    cards.first.wait_for()
    assert cards.count() == 1
    assert "delete_database" in cards.first.inner_text()


def test_recent_events_are_loaded_from_history_after_a_reload(dashboard: Dashboard) -> None:
    proxy, page = dashboard.proxy, dashboard.page
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        call(agent, session, "echo", {"n": 1}, 1)
        call(agent, session, "delete_database", {"db_name": "x"}, 2)

    def history() -> list[str]:
        with proxy.client() as c:
            return [e["id"] for e in c.get("/events/recent", params={"limit": 20}).json()]

    def shown() -> list[str]:
        ids: list[str] = page.locator("#activity li").evaluate_all(
            "items => items.map(i => i.dataset.id)"
        )
        return ids

    dashboard.sign_in()
    page.locator("#activity li[data-type='approval_required']").wait_for()
    before = history()
    assert shown() == before

    page.reload()
    page.locator("#live[data-state='live']").wait_for()
    page.locator("#activity li[data-type='approval_required']").wait_for()
    assert shown() == before  # the same feed, from history, right after the reload

    with proxy.client(proxy.agent_key) as agent:
        call(agent, session, "echo", {"n": 2}, 3)
    after = history()
    assert len(after) > len(before)
    page.locator(f"#activity li[data-id='{after[0]}']").wait_for()  # live, once
    assert shown() == after  # no gap between history and stream, nothing twice

    dashboard.go(f"#/sessions/{session}")
    page.locator(f"#activity li[data-id='{after[0]}']").wait_for()
    page.reload()
    page.locator(f"#activity li[data-id='{after[0]}']").wait_for()
    assert page.locator("#activity li[data-type='approval_required']").count() == 1
    dashboard.screenshot("session-activity-after-reload")
