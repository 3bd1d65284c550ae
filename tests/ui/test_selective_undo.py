"""Selective undo from the dashboard, in real Chromium against a real proxy: "Undo this" on
an undo entry and "Undo after this step" on a call, each behind a confirmation, and the second
confirmation when later calls may depend on it (docs/undo.md)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.ui.conftest import Dashboard
from tests.ui.test_dashboard import agent_call

CALLS = [
    ("send_email", {"to": "ada@example.com", "subject": "hi"}),
    ("create_record", {"table": "users", "data": {"name": "Ada"}}),
    ("transfer_funds", {"from_account": "a", "to_account": "b", "amount": 5}),
]


def _session(dashboard: Dashboard) -> str:
    session = str(uuid.uuid4())
    for step, (tool, args) in enumerate(CALLS, start=1):
        response = agent_call(dashboard.proxy, session, tool, args, step)
        assert response.status_code == 200, response.text
    return session


def _answer(page: Any, accept: list[bool]) -> list[str]:
    """Answer the page's next confirmations in order; the messages they showed."""
    shown: list[str] = []

    def on_dialog(dialog: Any) -> None:
        shown.append(dialog.message)
        dialog.accept() if accept.pop(0) else dialog.dismiss()

    page.on("dialog", on_dialog)
    return shown


def test_undo_after_a_step_undoes_the_later_calls_and_the_session_stays_active(
    dashboard: Dashboard,
) -> None:
    session = _session(dashboard)
    page = dashboard.page
    dashboard.sign_in()
    dashboard.go(f"#/sessions/{session}")
    first = page.locator("#effects-table tbody tr[data-step='1']")
    assert page.locator("#effects-table tbody tr[data-step='3'] .undo-after").count() == 0

    shown = _answer(page, [False, True])
    first.get_by_role("button", name="Undo after this step").click()  # cancelled: no request
    assert page.locator("#undo-table tbody tr[data-state='pending']").count() == 3
    first.get_by_role("button", name="Undo after this step").click()
    page.locator("#flash").filter(has_text="Undone: every call after step 1").wait_for()
    page.locator("#undo-table tbody tr[data-state='compensated']").nth(1).wait_for()

    states = page.locator("#undo-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.state)")
    assert states == ["compensated", "compensated", "pending"]
    assert page.locator("#session-state .state-active").count() == 1
    assert all("after step 1" in message for message in shown)
    dashboard.screenshot("session-undo-after-step")


def test_undo_this_asks_again_when_later_calls_may_depend_on_it(dashboard: Dashboard) -> None:
    session = _session(dashboard)
    page = dashboard.page
    dashboard.sign_in()
    dashboard.go(f"#/sessions/{session}")
    # The oldest entry (the e-mail) is the last row: two later calls stay in place.
    email = page.locator("#undo-table tbody tr").nth(2)
    # The refusal (409 dependent_effects) is logged by Chromium as a failed resource.
    dashboard.console.allow(r"status of 409")

    shown = _answer(page, [True, False, True, True])
    email.get_by_role("button", name="Undo this").click()  # confirmed, then not forced
    page.locator("#flash").filter(has_text="Nothing was undone").wait_for()
    assert email.get_attribute("data-state") == "pending"
    email.get_by_role("button", name="Undo this").click()  # confirmed and forced
    page.locator("#flash").filter(has_text="Undone: undo_send_email").wait_for()
    page.locator("#undo-table tbody tr[data-state='compensated']").wait_for()

    states = page.locator("#undo-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.state)")
    assert states == ["pending", "pending", "compensated"]
    assert "2 later call(s)" in shown[1]
    assert page.locator("#session-state .state-active").count() == 1
