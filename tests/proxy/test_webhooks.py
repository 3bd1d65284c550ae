"""Webhook notifications through a real proxy to a real local HTTP receiver, on both stores.

The receiver (tests/support/receiver.py) is a uvicorn server that records requests and can
answer 500, redirect, or be down. Retries are fast here (backoff 0.05 s, capped at 0.2 s); the
sender also polls every second, so every wait below is a poll with a deadline.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, spawn_proxy
from tests.support.receiver import Receiver, verify_signature
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from undolog.config import hash_api_key
from undolog.demo.catalog import DEMO_TOOLS
from undolog.webhook_config import WebhookConfig

SECRET = "whsec_" + "s" * 32
FAST = {
    "webhook_backoff_seconds": 0.05,
    "webhook_backoff_max_seconds": 0.2,
    "webhook_timeout_seconds": 2.0,
}
DEADLINE = 30.0


def hooked(
    proxy_factory: Any, receiver: Receiver, kind: str = "json", **overrides: Any
) -> ProxyHarness:
    hook = WebhookConfig("ops", receiver.url, SECRET, kind)
    harness: ProxyHarness = proxy_factory({"webhooks": (hook,)}, **(FAST | overrides))
    return harness


def ask_approval(proxy: ProxyHarness, db: str = "prod") -> dict[str, Any]:
    body = {
        "session_id": str(uuid.uuid4()),
        "tool_name": "delete_database",
        "step_index": 1,
        "args": {"db_name": db},
    }
    with proxy.client(proxy.agent_key) as c:
        response = c.post("/mcp/tool_call", json=body)
    assert response.status_code == 202, response.text
    pending: dict[str, Any] = response.json()
    return pending


def deliveries(proxy: ProxyHarness, **params: Any) -> list[dict[str, Any]]:
    with proxy.client() as c:
        response = c.get("/webhooks/deliveries", params=params)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def test_an_approval_request_is_delivered_signed_with_its_details(
    proxy_factory: Any, receiver: Receiver
) -> None:
    receiver.start()
    proxy = hooked(proxy_factory, receiver)
    pending = ask_approval(proxy)
    wait_until(lambda: bool(receiver.events("approval_required")), timeout=DEADLINE,
               what="the approval_required webhook")  # fmt: skip
    (request,) = receiver.at()
    assert verify_signature(SECRET, request.headers["x-undolog-signature"], request.body)
    assert not verify_signature("another secret", request.headers["x-undolog-signature"],
                                request.body)  # fmt: skip
    assert not verify_signature(SECRET, request.headers["x-undolog-signature"],
                                request.body + b" ")  # fmt: skip
    body = request.json()
    assert request.headers["x-undolog-event-id"] == body["id"]
    assert body["id"].startswith("evt_")
    assert body["type"] == "approval_required"
    assert body["org_id"] == proxy.org_id
    assert body["effect_id"] == pending["effect_id"]
    assert body["approval"]["approval_id"] == pending["approval_id"]
    assert body["approval"]["tool_name"] == "delete_database"
    assert body["approval"]["args"] == {"db_name": "prod"}
    assert body["approval"]["status"] == "pending"
    assert body["links"]["approval"] == (
        f"{proxy.settings.dashboard_url or 'http://127.0.0.1:8080'}/ui/#/approvals/pending/"
        f"{pending['approval_id']}"
    )

    with proxy.client(proxy.approver_key) as c:
        c.post(f"/approvals/{pending['approval_id']}/approve").raise_for_status()
    wait_until(lambda: bool(receiver.events("approval_approved")), timeout=DEADLINE,
               what="the approval_approved webhook")  # fmt: skip
    (decided,) = receiver.events("approval_approved")
    assert decided["approval"]["status"] == "approved"
    assert decided["approval"]["decided_by"] == "key:approver"
    wait_until(lambda: all(d["state"] == "delivered" for d in deliveries(proxy)),
               timeout=DEADLINE, what="both rows delivered")  # fmt: skip
    assert [d["attempts"] for d in deliveries(proxy)] == [1, 1]


def test_a_rejection_is_delivered_too(proxy_factory: Any, receiver: Receiver) -> None:
    receiver.start()
    proxy = hooked(proxy_factory, receiver)
    pending = ask_approval(proxy)
    with proxy.client(proxy.approver_key) as c:
        c.post(f"/approvals/{pending['approval_id']}/reject", json={"reason": "no"})
    wait_until(lambda: bool(receiver.events("approval_rejected")), timeout=DEADLINE,
               what="the approval_rejected webhook")  # fmt: skip
    assert receiver.events("approval_rejected")[0]["approval"]["reason"] == "no"


def test_a_timed_out_approval_is_delivered(
    proxy_factory: Any, receiver: Receiver, store_url: str
) -> None:
    receiver.start()
    hook = WebhookConfig("ops", receiver.url, SECRET, "json", ("approval_timed_out",))
    proxy = proxy_factory({"webhooks": (hook,), "approval_timeout_seconds": 1},
                          approval_sweep_seconds=0.1, **FAST)  # fmt: skip
    pending = ask_approval(proxy)
    wait_until(lambda: bool(receiver.events("approval_timed_out")), timeout=DEADLINE,
               what="the approval_timed_out webhook")  # fmt: skip
    (timed_out,) = receiver.events()  # only the event it subscribed to
    assert timed_out["approval"]["approval_id"] == pending["approval_id"]
    assert timed_out["approval"]["status"] == "timed_out"


def test_the_slack_message_has_approve_and_reject_links_to_the_dashboard(
    proxy_factory: Any, receiver: Receiver
) -> None:
    receiver.start()
    proxy = hooked(proxy_factory, receiver, "slack",
                   dashboard_url="https://undolog.example.com")  # fmt: skip
    pending = ask_approval(proxy, db="<prod & co>")
    wait_until(lambda: bool(receiver.at()), timeout=DEADLINE, what="the slack message")
    message = receiver.at()[0].json()
    assert set(message) == {"text", "blocks"}
    assert "Approval required" in message["text"]
    assert "delete_database" in message["text"]
    section, actions = message["blocks"]
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    # The agent's text cannot inject Slack markup (links, mentions).
    assert "&lt;prod &amp; co&gt;" in section["text"]["text"]
    assert "<prod" not in section["text"]["text"]
    link = f"https://undolog.example.com/ui/#/approvals/pending/{pending['approval_id']}"
    assert actions["type"] == "actions"
    assert [(b["text"]["text"], b["url"], b["style"]) for b in actions["elements"]] == [
        ("Approve", link, "primary"),
        ("Reject", link, "danger"),
    ]


def test_a_receiver_that_is_down_loses_nothing(proxy_factory: Any, receiver: Receiver) -> None:
    proxy = hooked(proxy_factory, receiver)  # the receiver is not started: refused
    approvals = [ask_approval(proxy, db=f"db{n}")["approval_id"] for n in range(3)]
    wait_until(
        lambda: all(d["attempts"] >= 2 for d in deliveries(proxy)) and len(deliveries(proxy)) == 3,
        timeout=DEADLINE, what="failed attempts",
    )  # fmt: skip
    assert {d["last_error"] for d in deliveries(proxy)} == {
        "connection failed (ClientConnectorError)"
    }
    assert {d["state"] for d in deliveries(proxy)} == {"pending"}
    receiver.start()
    wait_until(lambda: len(receiver.events()) == 3, timeout=DEADLINE, what="3 deliveries")
    assert sorted(e["approval"]["approval_id"] for e in receiver.events()) == sorted(approvals)
    wait_until(lambda: {d["state"] for d in deliveries(proxy)} == {"delivered"},
               timeout=DEADLINE, what="rows delivered")  # fmt: skip


def test_a_500_is_retried_with_the_same_event_id_then_dead(
    proxy_factory: Any, receiver: Receiver
) -> None:
    receiver.status = 500
    receiver.answer_body = b"RECEIVER-INTERNAL-DETAIL"
    receiver.start()
    proxy = hooked(proxy_factory, receiver, webhook_max_attempts=3)
    ask_approval(proxy)
    wait_until(lambda: bool(deliveries(proxy, state="dead")), timeout=DEADLINE, what="a dead row")
    (dead,) = deliveries(proxy, state="dead")
    assert (dead["attempts"], dead["last_error"]) == (3, "HTTP 500")
    ids = {r.headers["x-undolog-event-id"] for r in receiver.at()}
    assert len(receiver.at()) == 3 and ids == {dead["event_id"]}
    with proxy.client() as c:
        everything = c.get("/webhooks/deliveries").text
    assert "RECEIVER-INTERNAL-DETAIL" not in everything


def test_a_receiver_back_after_500s_gets_the_event(proxy_factory: Any, receiver: Receiver) -> None:
    receiver.status = 500
    receiver.start()
    proxy = hooked(proxy_factory, receiver)
    ask_approval(proxy)
    wait_until(lambda: len(receiver.at()) >= 2, timeout=DEADLINE, what="two failed attempts")
    receiver.status = 200
    wait_until(lambda: deliveries(proxy)[0]["state"] == "delivered", timeout=DEADLINE,
               what="the row delivered")  # fmt: skip
    assert deliveries(proxy)[0]["attempts"] >= 3


@pytest.mark.security
def test_a_redirect_is_not_followed(proxy_factory: Any, receiver: Receiver) -> None:
    receiver.redirect_to = f"http://127.0.0.1:{receiver.port}/elsewhere"
    receiver.start()
    proxy = hooked(proxy_factory, receiver, webhook_max_attempts=2)
    ask_approval(proxy)
    wait_until(lambda: bool(deliveries(proxy, state="dead")), timeout=DEADLINE, what="a dead row")
    assert deliveries(proxy, state="dead")[0]["last_error"] == (
        "HTTP 302 (redirects are not followed)"
    )
    assert receiver.at("/elsewhere") == []


@pytest.mark.security
def test_only_admin_keys_see_deliveries(proxy_factory: Any, receiver: Receiver) -> None:
    proxy = hooked(proxy_factory, receiver)
    for key in (proxy.agent_key, proxy.approver_key):
        with proxy.client(key) as c:
            assert c.get("/webhooks/deliveries").status_code == 403
    with proxy.client() as c:
        assert c.get("/webhooks/deliveries", params={"state": "x"}).status_code == 400
        assert c.get("/webhooks/deliveries", params={"limit": "100000"}).status_code == 400


@pytest.mark.security
def test_another_orgs_deliveries_are_not_listed(proxy_factory: Any, receiver: Receiver) -> None:
    receiver.start()
    first = hooked(proxy_factory, receiver)
    ask_approval(first)
    wait_until(lambda: bool(deliveries(first)), timeout=DEADLINE, what="a row")
    second = proxy_factory()
    assert deliveries(second) == []


def _config(path: Path, org_id: str, key: str, receiver: Receiver) -> Path:
    path.write_text(
        "[server]\nwebhook_backoff_seconds = 0.05\nwebhook_backoff_max_seconds = 0.2\n"
        "webhook_timeout_seconds = 1.0\n"
        f'[[orgs]]\nid = "{org_id}"\n'
        f'[[orgs.keys]]\nname = "admin"\nrole = "admin"\nsha256 = "{hash_api_key(key)}"\n'
        f'[[orgs.webhooks]]\nname = "ops"\nurl = "{receiver.url}"\nsecret = "{SECRET}"\n',
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
def test_rows_left_by_a_killed_proxy_are_delivered_after_a_restart(
    store_url: str, demo_upstream: ThreadServer, receiver: Receiver, tmp_path: Path
) -> None:
    org_id, key = f"org-{uuid.uuid4().hex[:12]}", f"ul_test_{uuid.uuid4().hex}"
    config = _config(tmp_path / "undolog.toml", org_id, key, receiver)
    headers = {"X-Api-Key": key}
    started: list[ProcessServer] = []
    try:
        first = spawn_proxy(store_url, demo_upstream.url, config, log_path=tmp_path / "1.log")
        started.append(first)
        with httpx.Client(base_url=first.url, headers=headers, timeout=30) as c:
            for name, spec in DEMO_TOOLS.items():
                c.put(f"/tools/{name}", json=spec).raise_for_status()
            pending = [
                c.post("/mcp/tool_call", json={"session_id": str(uuid.uuid4()),
                       "tool_name": "delete_database", "step_index": 1,
                       "args": {"db_name": f"db{n}"}}).json()
                for n in range(3)
            ]  # fmt: skip

            def tried() -> bool:
                rows = c.get("/webhooks/deliveries").json()
                return len(rows) == 3 and all(r["attempts"] >= 1 for r in rows)

            wait_until(tried, timeout=DEADLINE, what="attempts against the down receiver")
        first.kill()  # kill -9 with three undelivered rows in the outbox
        receiver.start()
        second = spawn_proxy(store_url, demo_upstream.url, config, log_path=tmp_path / "2.log")
        started.append(second)
        wait_until(lambda: len(receiver.events()) == 3, timeout=DEADLINE,
                   what="the three deliveries after the restart")  # fmt: skip
    finally:
        for server in started:
            server.stop()
    delivered = sorted(e["approval"]["approval_id"] for e in receiver.events())
    assert delivered == sorted(p["approval_id"] for p in pending)
