"""A partial approval (1 of N) is announced, on both stores (docs/approvals.md,
docs/notifications.md).

Before: with a `require` rule for N distinct approvers, the approvals before the last one sent
no event and no webhook, so a dashboard could not show "1 of 2" until someone reloaded it.
Now each approval that leaves the call waiting is an `approval_partially_approved` event
(approvals so far, approvers needed, the approver's key name), on the SSE stream and, through
the outbox, to a real local webhook receiver; the approval's JSON carries `approvals`.
"""

from __future__ import annotations

import uuid
from typing import Any

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_policy_rules import call, set_rules
from tests.proxy.test_webhooks import DEADLINE, SECRET, deliveries, hooked
from tests.support.receiver import Receiver, verify_signature
from tests.support.servers import wait_until
from tests.support.sse import EventStream

TWO_FOR_MAIL = {"name": "two-for-mail", "tool": "send_email", "action": "require",
                "approvers": 2}  # fmt: skip
MAIL = {"to": "x@elsewhere.org", "subject": "s"}


def ask(proxy: ProxyHarness, session: str) -> str:
    with proxy.client(proxy.agent_key) as agent:
        asked = call(agent, "send_email", session, 1, **MAIL)
    assert asked.status_code == 202, asked.text
    return str(asked.json()["approval_id"])


async def test_the_first_of_two_approvals_is_an_event_and_the_card_counts_it(
    proxy: ProxyHarness,
) -> None:
    set_rules(proxy, TWO_FOR_MAIL)
    session = str(uuid.uuid4())
    async with (
        proxy.async_client(proxy.approver_key) as approver,
        proxy.async_client() as admin,
        EventStream(approver) as stream,
    ):
        approval_id = ask(proxy, session)
        first = await approver.post(f"/approvals/{approval_id}/approve")
        assert first.status_code == 200, first.text
        partial = (await stream.until("approval_partially_approved"))[-1]
        card = (await approver.get(f"/approvals/{approval_id}")).json()
        again = await approver.post(f"/approvals/{approval_id}/approve")  # counts once
        done = await admin.post(f"/approvals/{approval_id}/approve")
        assert done.status_code == 200, done.text
        rest = await stream.until("approval_approved")
        listed = (await approver.get("/approvals", params={"state": "all"})).json()

    assert partial.json["session_id"] == session
    assert partial.json["payload"] == {
        "approval_id": approval_id,
        "tool_name": "send_email",
        "rule": "two-for-mail",
        "approvals": 1,
        "approvers_required": 2,
        "approver": "key:approver",
        "args_hash": card["args_hash"],  # what this approval was for: the requested args
    }
    assert card["args_hash"] == card["requested_args_hash"]
    assert (card["status"], card["approvals"], card["approvers_required"]) == ("pending", 1, 2)
    assert card["approved_by"] == ["key:approver"]
    assert again.json()["approvals"] == 1
    # The same key approving again changes nothing: no second partial event.
    assert [e.event for e in rest].count("approval_partially_approved") == 0
    [row] = [a for a in listed if a["id"] == approval_id]
    assert (row["approvals"], row["status"]) == (2, "approved")


def test_the_first_of_two_approvals_reaches_the_webhook(
    proxy_factory: Any, receiver: Receiver
) -> None:
    receiver.start()
    proxy = hooked(proxy_factory, receiver)
    set_rules(proxy, TWO_FOR_MAIL)
    approval_id = ask(proxy, str(uuid.uuid4()))
    with proxy.client(proxy.approver_key) as approver:
        approver.post(f"/approvals/{approval_id}/approve").raise_for_status()
    wait_until(lambda: bool(receiver.events("approval_partially_approved")), timeout=DEADLINE,
               what="the approval_partially_approved webhook")  # fmt: skip
    [request] = [r for r in receiver.at() if r.json()["type"] == "approval_partially_approved"]
    assert verify_signature(SECRET, request.headers["x-undolog-signature"], request.body)
    assert request.headers["x-undolog-event"] == "approval_partially_approved"
    body = request.json()
    assert body["data"]["approvals"] == 1
    assert body["data"]["approvers_required"] == 2
    assert body["data"]["approver"] == "key:approver"
    assert body["approval"]["approval_id"] == approval_id
    assert body["approval"]["status"] == "pending"
    assert (body["approval"]["approvals"], body["approval"]["approvers_required"]) == (1, 2)
    assert body["approval"]["approved_by"] == ["key:approver"]
    wait_until(lambda: all(d["state"] == "delivered" for d in deliveries(proxy)),
               timeout=DEADLINE, what="every row delivered")  # fmt: skip


def test_the_slack_message_says_one_of_two(proxy_factory: Any, receiver: Receiver) -> None:
    receiver.start()
    proxy = hooked(proxy_factory, receiver, kind="slack")
    set_rules(proxy, TWO_FOR_MAIL)
    approval_id = ask(proxy, str(uuid.uuid4()))
    with proxy.client(proxy.approver_key) as approver:
        approver.post(f"/approvals/{approval_id}/approve").raise_for_status()

    def partial() -> list[Any]:
        return [
            r for r in receiver.at()
            if r.headers.get("x-undolog-event") == "approval_partially_approved"
        ]  # fmt: skip

    wait_until(lambda: bool(partial()), timeout=DEADLINE, what="the Slack message")
    text = partial()[0].json()["blocks"][0]["text"]["text"]
    assert "*Partly approved*" in text
    assert "approvals: 1 of 2 (key:approver)" in text
    assert partial()[0].json()["text"].startswith("UndoLog: Partly approved: send_email")
