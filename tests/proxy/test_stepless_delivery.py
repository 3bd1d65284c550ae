"""`POST /mcp/tool_call` without `step_index`: a retry only while the call's answer is owed.

The proxy watches the HTTP answer of a step-less call it runs and marks the effect delivered
once the body went out to a connected client; an identical call after that is a new step, while
one whose answer was lost (the client hung up first) replays it. In SDK mode the commit or
fail of the effect is its delivery. Everything is real: a uvicorn proxy on both stores in front
of the demo tool server; the lost answer is made by holding the upstream call until the client
has gone, and how often a tool ran is read from the demo server's own state.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_edge import assert_error, recorded_sessions
from tests.support.servers import ThreadServer, await_until
from undolog.demo.tools import DemoToolState, create_demo_tools_app

TOOL_CALL = "/mcp/tool_call"
EMAIL = {"to": "ada@example.com", "subject": "hello"}


def stepless(session_id: str, tool: str = "send_email", args: Any = None) -> dict[str, Any]:
    return {"session_id": session_id, "tool_name": tool, "args": EMAIL if args is None else args}


def effects(proxy: ProxyHarness, session_id: str) -> list[dict[str, Any]]:
    """The session's effects in step order (none while the session does not exist)."""
    with proxy.client() as c:
        response = c.get(f"/sessions/{session_id}")
    if response.status_code == 404:
        return []
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["effects"]
    return found


def step_of(response: httpx.Response) -> int:
    return int(response.headers["X-UndoLog-Step-Index"])


class HeldUpstream:
    """The demo tool server, except that calls of `tool` wait until `release()`.

    The hold is in front of the demo app, so a held call is counted only once it goes on.
    """

    def __init__(self, tool: str) -> None:
        self.state = DemoToolState()
        self.app = create_demo_tools_app(self.state, inspect=True)
        self.path = f"/tools/{tool}"
        self.held = 0  # calls that reached the hold
        self._open = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._loop = asyncio.get_running_loop()
        if scope["type"] == "http" and scope["path"] == self.path:
            self.held += 1
            await self._open.wait()
        await self.app(scope, receive, send)

    def release(self) -> None:
        """Let held calls (and every later one) through; callable from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._open.set)


@pytest.fixture
def held_email() -> Iterator[tuple[HeldUpstream, ThreadServer]]:
    upstream = HeldUpstream("send_email")
    server = ThreadServer(upstream).start()
    try:
        yield upstream, server
    finally:
        upstream.release()
        server.stop()


def requests_in_flight(proxy: ProxyHarness) -> int:
    """Requests the proxy's server is still answering on a connection that is still open.

    Read from uvicorn's connection state: a connection leaves it when uvicorn has seen the
    client hang up, and that is when the proxy's request learns it too.
    """
    assert proxy.server is not None and proxy.server.server is not None
    connections = list(proxy.server.server.server_state.connections)
    return sum(
        1
        for c in connections
        if getattr(c, "cycle", None) is not None and not c.cycle.response_complete
    )


# --- answers received: a repeat is a new call ----------------------------------------------


def test_an_identical_call_after_its_answer_was_received_is_the_next_step(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client() as c:
        first = c.post(TOOL_CALL, json=stepless(session))
        second = c.post(TOOL_CALL, json=stepless(session))
    assert [first.status_code, second.status_code] == [200, 200], second.text
    assert [first.json()["status"], second.json()["status"]] == ["executed", "executed"]
    assert [step_of(first), step_of(second)] == [1, 2]
    ids = [first.json()["effect_id"], second.json()["effect_id"]]
    assert ids[0] != ids[1]
    assert [(e["effect_id"], e["step_index"], e["state"]) for e in effects(proxy, session)] == [
        (ids[0], 1, "committed"),
        (ids[1], 2, "committed"),
    ]
    with proxy.upstream() as upstream:
        assert upstream.get("/executions/send_email").json() == dict.fromkeys(ids, 1)


def test_a_client_that_repeats_a_call_the_moment_it_has_the_answer_gets_a_step_each_time(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client() as c:  # one keep-alive connection, each call sent on the last answer
        answers = [c.post(TOOL_CALL, json=stepless(session, "echo", {"n": 1})) for _ in range(20)]
    assert [(a.status_code, a.json()["status"]) for a in answers] == [(200, "executed")] * 20
    assert [step_of(a) for a in answers] == list(range(1, 21))
    ids = [a.json()["effect_id"] for a in answers]
    assert len(set(ids)) == 20
    assert [e["step_index"] for e in effects(proxy, session)] == list(range(1, 21))
    assert proxy.counters("echo") == dict.fromkeys(ids, 1)


# --- a lost answer: the retry replays it -----------------------------------------------------


async def test_a_call_whose_client_hung_up_is_replayed_to_its_retry_and_then_done_with(
    proxy_factory: Any, held_email: tuple[HeldUpstream, ThreadServer]
) -> None:
    upstream, server = held_email
    proxy: ProxyHarness = proxy_factory(upstream_url=server.url)
    session = str(uuid.uuid4())

    async with proxy.async_client() as gone:
        lost = asyncio.create_task(gone.post(TOOL_CALL, json=stepless(session)))
        await await_until(
            lambda: (
                upstream.held == 1
                and [e["state"] for e in effects(proxy, session)] == ["executing"]
            ),
            what="the call to run, held at the upstream",
        )
        lost.cancel()  # the client gives up: its connection closes
        with contextlib.suppress(asyncio.CancelledError):
            await lost
    await await_until(lambda: requests_in_flight(proxy) == 0, what="the proxy to see it go")
    upstream.release()
    await await_until(
        lambda: [e["state"] for e in effects(proxy, session)] == ["committed"],
        what="the call to finish without its client",
    )
    (effect,) = effects(proxy, session)
    assert upstream.state.executions["send_email"] == {effect["effect_id"]: 1}

    async with proxy.async_client() as client:
        retry = await client.post(TOOL_CALL, json=stepless(session))
        assert retry.status_code == 200, retry.text
        assert retry.json()["status"] == "replayed"
        assert retry.json()["effect_id"] == effect["effect_id"]
        assert retry.json()["result"]["success"] is True
        assert step_of(retry) == 1
        assert upstream.state.executions["send_email"] == {effect["effect_id"]: 1}

        repeat = await client.post(TOOL_CALL, json=stepless(session))
    assert repeat.status_code == 200, repeat.text
    assert (repeat.json()["status"], step_of(repeat)) == ("executed", 2)
    assert repeat.json()["effect_id"] != effect["effect_id"]
    assert upstream.state.executions["send_email"] == {
        effect["effect_id"]: 1,
        repeat.json()["effect_id"]: 1,
    }
    assert [e["step_index"] for e in effects(proxy, session)] == [1, 2]


# --- SDK mode: commit or fail delivers ------------------------------------------------------


def test_an_sdk_call_committed_is_delivered_so_the_same_call_again_is_the_next_step(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    sdk = {"X-UndoLog-Mode": "sdk"}
    with proxy.client() as c:
        first = c.post(TOOL_CALL, json=stepless(session), headers=sdk)
        assert first.status_code == 200, first.text
        assert (first.json()["status"], step_of(first)) == ("execute", 1)
        effect_id = first.json()["effect_id"]
        reported = c.post(f"/effects/{effect_id}/commit", json={"result": {"sent": True}})
        assert reported.status_code == 200, reported.text

        again = c.post(TOOL_CALL, json=stepless(session), headers=sdk)
        by_body = c.post(TOOL_CALL, json={**stepless(session), "mode": "sdk"})
    assert again.status_code == 200, again.text
    assert (again.json()["status"], step_of(again), again.json()["step_index"]) == (
        "execute",
        2,
        2,
    )
    assert again.json()["effect_id"] != effect_id
    # The second call is still running in the SDK: the third is its retry, told to wait.
    assert_error(by_body, 409, "in_progress")
    assert by_body.json()["effect_id"] == again.json()["effect_id"]
    assert [(e["step_index"], e["state"]) for e in effects(proxy, session)] == [
        (1, "committed"),
        (2, "executing"),
    ]
    assert proxy.counters("send_email") == {}


def test_an_sdk_call_that_failed_is_run_again_on_its_effect_by_the_same_call(
    proxy: ProxyHarness,
) -> None:
    """A failure is no result: the same call again is its retry, with the same effect id."""
    session = str(uuid.uuid4())
    sdk = {"X-UndoLog-Mode": "sdk"}
    with proxy.client() as c:
        first = c.post(TOOL_CALL, json=stepless(session), headers=sdk)
        effect_id = first.json()["effect_id"]
        reported = c.post(f"/effects/{effect_id}/fail", json={"error": "smtp said no"})
        assert reported.status_code == 200, reported.text
        again = c.post(TOOL_CALL, json=stepless(session), headers=sdk)
    assert again.status_code == 200, again.text
    assert (again.json()["effect_id"], again.json()["attempt"], step_of(again)) == (
        effect_id,
        2,
        1,
    )
    assert [(e["step_index"], e["state"]) for e in effects(proxy, session)] == [(1, "executing")]


# --- malformed --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["proxy", "sdk"])
def test_a_stepless_call_with_a_session_id_that_is_no_uuid_is_400_and_records_nothing(
    proxy: ProxyHarness, mode: str
) -> None:
    with proxy.client() as c:
        response = c.post(TOOL_CALL, json={**stepless("session-1"), "mode": mode})
    assert_error(response, 400, "invalid_request")
    assert "X-UndoLog-Step-Index" not in response.headers
    assert recorded_sessions(proxy) == []
    assert proxy.counters("send_email") == {}
