"""`GET /approvals/{id}?wait=N`: a long wait for a decision, through real proxies, on both
stores. A wait is answered when the approval is decided (here or by another proxy process on
the same database) or after N seconds with the pending approval; waits are capped per key."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.support.servers import await_until, wait_until
from undolog.services.waits import DEFAULT_MAX_PER_KEY

DEADLINE = 20.0  # a wait not woken by the decision would block 25 s: the join fails first


def ask_approval(proxy: ProxyHarness) -> str:
    body = {
        "session_id": str(uuid.uuid4()),
        "tool_name": "delete_database",
        "step_index": 1,
        "args": {"db_name": "prod"},
    }
    with proxy.client(proxy.agent_key) as c:
        response = c.post("/mcp/tool_call", json=body)
    assert response.status_code == 202, response.text
    approval_id: str = response.json()["approval_id"]
    return approval_id


class Waiter(threading.Thread):
    """One `GET ?wait=` in a thread; its response once it returns."""

    def __init__(self, proxy: ProxyHarness, approval_id: str, seconds: int = 25) -> None:
        super().__init__(daemon=True)
        self.proxy, self.approval_id, self.seconds = proxy, approval_id, seconds
        self.response: httpx.Response | None = None

    def run(self) -> None:
        with self.proxy.client(self.proxy.approver_key) as c:
            self.response = c.get(f"/approvals/{self.approval_id}", params={"wait": self.seconds})


def answered(waiter: Waiter) -> dict[str, Any]:
    waiter.join(timeout=DEADLINE)
    assert not waiter.is_alive(), "the wait was not woken by the decision"
    assert waiter.response is not None
    assert waiter.response.status_code == 200, waiter.response.text
    body: dict[str, Any] = waiter.response.json()
    return body


def waiting(proxy: ProxyHarness, count: int) -> bool:
    waits = proxy.runtime.waits
    return bool(waits._total >= count)


def test_a_wait_returns_when_another_request_approves(proxy: ProxyHarness) -> None:
    approval_id = ask_approval(proxy)
    waiter = Waiter(proxy, approval_id)
    waiter.start()
    wait_until(lambda: waiting(proxy, 1), what="the wait to start")
    with proxy.client(proxy.approver_key) as c:
        c.post(f"/approvals/{approval_id}/approve").raise_for_status()
    body = answered(waiter)
    assert (body["id"], body["status"]) == (approval_id, "approved")


def test_a_wait_returns_when_another_proxy_process_rejects(proxy_factory: Any) -> None:
    first: ProxyHarness = proxy_factory()
    second: ProxyHarness = proxy_factory(org_id=first.org_id)  # the same database and org
    approval_id = ask_approval(first)
    waiter = Waiter(first, approval_id)
    waiter.start()
    wait_until(lambda: waiting(first, 1), what="the wait to start")
    with second.client(second.approver_key) as c:
        c.post(f"/approvals/{approval_id}/reject").raise_for_status()
    assert answered(waiter)["status"] == "rejected"


def test_a_wait_that_times_out_answers_pending(proxy: ProxyHarness) -> None:
    approval_id = ask_approval(proxy)
    with proxy.client(proxy.approver_key) as c:
        response = c.get(f"/approvals/{approval_id}", params={"wait": 1})
    assert response.status_code == 200
    assert response.json()["status"] == "pending"


def test_a_decided_approval_answers_at_once_and_long_waits_are_clamped(
    proxy: ProxyHarness,
) -> None:
    approval_id = ask_approval(proxy)
    with proxy.client(proxy.approver_key) as c:
        c.post(f"/approvals/{approval_id}/approve").raise_for_status()
        response = c.get(f"/approvals/{approval_id}", params={"wait": 3600})  # taken as 55
    assert (response.status_code, response.json()["status"]) == (200, "approved")


@pytest.mark.security
@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "9" * 40])
def test_a_bad_wait_is_refused(proxy: ProxyHarness, value: str) -> None:
    approval_id = ask_approval(proxy)
    with proxy.client(proxy.approver_key) as c:
        response = c.get(f"/approvals/{approval_id}", params={"wait": value})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"


@pytest.mark.security
def test_another_orgs_approval_is_not_waited_on(proxy_factory: Any) -> None:
    mine: ProxyHarness = proxy_factory()
    theirs: ProxyHarness = proxy_factory()
    approval_id = ask_approval(theirs)
    with mine.client(mine.approver_key) as c:
        response = c.get(f"/approvals/{approval_id}", params={"wait": 30})
    assert response.status_code == 404


@pytest.mark.security
def test_many_waits_of_one_key_are_capped_and_the_server_keeps_answering(
    proxy: ProxyHarness,
) -> None:
    approval_id = ask_approval(proxy)

    async def storm() -> list[httpx.Response]:
        async with proxy.async_client(proxy.approver_key) as c:
            url = f"/approvals/{approval_id}"
            held = [
                asyncio.create_task(c.get(url, params={"wait": 25}))
                for _ in range(DEFAULT_MAX_PER_KEY)
            ]
            await await_until(lambda: waiting(proxy, DEFAULT_MAX_PER_KEY), what="held waits")
            refused = [await c.get(url, params={"wait": 25}) for _ in range(20)]
            plain = await c.get(url)  # a read without a wait still answers
            async with proxy.async_client(proxy.api_key) as admin:
                other_key = await admin.get(url, params={"wait": 1})  # another key's slots
            await c.post(f"/approvals/{approval_id}/approve")
            done = await asyncio.gather(*held)
            return [*refused, plain, other_key, *done]

    responses = asyncio.run(asyncio.wait_for(storm(), DEADLINE * 2))
    refused, plain, other_key, done = (
        responses[:20], responses[20], responses[21], responses[22:],
    )  # fmt: skip
    assert {r.status_code for r in refused} == {429}
    assert refused[0].json()["code"] == "rate_limited"
    assert "retry-after" in refused[0].headers
    assert plain.status_code == 200 and other_key.status_code == 200
    assert [r.json()["status"] for r in done] == ["approved"] * DEFAULT_MAX_PER_KEY
    assert proxy.runtime.waits._total == 0
