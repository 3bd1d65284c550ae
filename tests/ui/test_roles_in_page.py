"""Every button the page shows works for the key signed in (issue 24): in real Chromium, an
approver rolls back a session and undoes one entry, and is recorded as who asked; an action
the role may not use (an operator's retry and resolve) is disabled with the reason."""

from __future__ import annotations

import uuid
from typing import Any

from tests.ui.conftest import Dashboard
from tests.ui.test_dashboard import agent_call

EMAIL = {"to": "ada@example.com", "subject": "hi"}


def _agent_session(dashboard: Dashboard, *calls: tuple[str, dict[str, Any]]) -> str:
    session = str(uuid.uuid4())
    for step, (tool, args) in enumerate(calls, start=1):
        response = agent_call(dashboard.proxy, session, tool, args, step)
        assert response.status_code == 200, response.text
    return session


def test_an_approver_rolls_back_and_undoes_from_the_page_and_is_recorded(
    dashboard: Dashboard,
) -> None:
    proxy = dashboard.proxy
    undone = _agent_session(dashboard, ("send_email", EMAIL))
    rolled = _agent_session(
        dashboard, ("send_email", EMAIL), ("create_record", {"table": "t", "data": {}})
    )
    page = dashboard.page
    page.on("dialog", lambda dialog: dialog.accept())  # the undo's confirmation
    dashboard.sign_in(proxy.approver_key)
    assert page.locator("#key-name").inner_text() == "approver (approver)"

    dashboard.go(f"#/sessions/{undone}")
    page.get_by_role("button", name="Undo this").click()
    page.locator("#flash").filter(has_text="Undone: undo_send_email").wait_for()
    page.locator("#undo-table tbody tr[data-state='compensated']").wait_for()
    started = page.locator("#activity li[data-type='compensation_started']")
    assert "by key:approver" in started.first.inner_text()

    dashboard.go(f"#/sessions/{rolled}")
    page.get_by_role("button", name="Roll back").click()
    page.locator("#confirm-dialog").get_by_role("button", name="Roll back").click()
    page.locator("#session-state .state-compensated").wait_for()
    page.locator("#flash").filter(has_text="Rolled back").wait_for()
    asked = page.locator("#activity li[data-type='session_compensating']")
    assert "by key:approver" in asked.first.inner_text()
    assert "may not" not in page.locator("#flash").inner_text()
    assert proxy.counters("undo_send_email") != {}
    dashboard.screenshot("approver-rolled-back")


def test_an_approver_sees_retry_and_resolve_disabled_with_the_reason(
    dashboard: Dashboard,
) -> None:
    proxy = dashboard.proxy
    with proxy.client() as admin:
        admin.put("/tools/send_email", json={"tier": "compensable", "compensation": {
            "fn_name": "undo_send_email", "max_retries": 0, "retry_backoff_ms": 10,
            "args": {"fail_times": 1000}}}).raise_for_status()  # fmt: skip
    session = _agent_session(dashboard, ("send_email", EMAIL))
    dashboard.console.allow(r"status of 502")  # the rollback's compensation_failed
    page = dashboard.page
    dashboard.sign_in(proxy.approver_key)
    dashboard.go(f"#/sessions/{session}")
    page.get_by_role("button", name="Roll back").click()
    page.locator("#confirm-dialog").get_by_role("button", name="Roll back").click()
    page.locator("#session-state .state-compensation_failed").wait_for()
    failed = page.locator("#undo-table tr[data-state='failed']")
    for name in ("Retry", "Resolve"):
        button = failed.get_by_role("button", name=name)
        assert button.is_disabled(), name
        assert "admin key" in (button.get_attribute("title") or "")
    assert "need an admin key" in failed.inner_text()
