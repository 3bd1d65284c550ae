"""Rolling a session back from the SDK, against a real proxy (uvicorn on loopback), both stores.

A block that raises rolls its session back; `session.rollback()` does it on demand; a block that
ends normally completes the session. The compensations of SDK-executed tools are functions
registered with `@compensation(fn_name)` and run here, in the test's process: the SDK claims
each entry from the engine, so the LIFO order holds across local and proxy-run entries (the
proxy runs the demo upstream's `undo_send_email`). Each test registers its compensations under
names of its own, so no test sees another's functions.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import decide_approval, session_view
from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    ProxyError,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    undolog_tool,
)
from undolog_sdk.compensation import compensation
from undolog_sdk.errors import CompensationFailed, SessionClosed

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

EMAIL = {"to": "ada@example.com", "subject": "Your refund"}

Tool = Callable[..., Coroutine[Any, Any, Any]]


class Boom(Exception):
    """The agent's own error, raised inside a session block."""


@pytest.fixture
async def client(proxy: ProxyHarness) -> AsyncIterator[UndoLogClient]:
    sdk_client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


class Ledger:
    """Local compensations registered for one test, and every call they got, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], int]] = []  # (fn_name, payload, ns)

    def register(
        self,
        label: str,
        *,
        fail_times: int = 0,
        check: Callable[[], Coroutine[Any, Any, None]] | None = None,
    ) -> str:
        """Register a compensation under a fresh name; it fails its first `fail_times` calls
        (-1: every call) and awaits `check` first. Returns the registered name."""
        fn_name = f"{label}_{uuid.uuid4().hex[:8]}"

        @compensation(fn_name)
        async def undo(**payload: Any) -> None:
            self.calls.append((fn_name, payload, time.monotonic_ns()))
            if check is not None:
                await check()
            if fail_times < 0 or len(self.names(fn_name)) <= fail_times:
                raise RuntimeError(f"{fn_name} cannot undo this yet")

        return fn_name

    def names(self, fn_name: str | None = None) -> list[str]:
        return [name for name, _, _ in self.calls if fn_name in (None, name)]

    def payloads(self, fn_name: str) -> list[dict[str, Any]]:
        return [payload for name, payload, _ in self.calls if name == fn_name]


def write_tool(
    client: UndoLogClient,
    name: str,
    fn_name: str,
    *,
    captured: dict[str, Any] | None = None,
    max_retries: int = 3,
    retry_backoff_ms: int = 1,
) -> Tool:
    """A COMPENSABLE SDK tool named `name` whose compensation is `fn_name`; it returns a row."""
    descriptor = CompensationDescriptor(
        fn_name=fn_name,
        args=dict(captured or {}),
        max_retries=max_retries,
        retry_backoff_ms=retry_backoff_ms,
    )

    async def tool(n: int) -> dict[str, Any]:
        return {"row_id": f"{name}-{n}", "n": n}

    tool.__name__ = name
    return undolog_tool(tier=ToolTier.COMPENSABLE, compensation=descriptor, client=client)(tool)


def entries_by_fn(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["fn_name"]: entry for entry in view["undo_stack"]}


def effect_states(view: dict[str, Any]) -> dict[str, str]:
    return {effect["tool_name"]: effect["state"] for effect in view["effects"]}


def upstream_calls(proxy: ProxyHarness, session_id: str, tool: str) -> list[dict[str, Any]]:
    with proxy.upstream() as upstream:
        calls: list[dict[str, Any]] = upstream.get("/calls").json()
    return [c for c in calls if c["session_id"] == session_id and c["tool"] == tool]


# --- a block that raises ------------------------------------------------------------------------


async def test_a_block_that_raises_runs_the_local_compensations_newest_first_and_re_raises(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a, undo_b = ledger.register("undo_a"), ledger.register("undo_b")
    write_a = write_tool(client, "write_a", undo_a, captured={"reason": "rolled back"})
    write_b = write_tool(client, "write_b", undo_b)
    boom = Boom("the agent gave up")
    session = UndoLogSession(org_id=proxy.org_id)

    with pytest.raises(Boom) as raised:
        async with session:
            first = await write_a(1, _session=session)
            second = await write_b(2, _session=session)
            third = await write_a(3, _session=session)
            raise boom

    assert raised.value is boom
    assert not getattr(boom, "__notes__", None)  # the rollback finished
    assert ledger.names() == [undo_a, undo_b, undo_a]
    assert [payload for _, payload, _ in ledger.calls] == [
        {"reason": "rolled back", "original_args": {"n": 3}, "original_result": third},
        {"original_args": {"n": 2}, "original_result": second},
        {"reason": "rolled back", "original_args": {"n": 1}, "original_result": first},
    ]
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"
    assert [e["state"] for e in view["effects"]] == ["compensated"] * 3
    assert [(u["state"], u["attempts"]) for u in view["undo_stack"]] == [("compensated", 1)] * 3


async def test_a_call_whose_tool_raised_is_skipped_and_its_compensation_never_runs(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_ok, undo_broken = ledger.register("undo_ok"), ledger.register("undo_broken")
    write_ok = write_tool(client, "write_ok", undo_ok)

    @undolog_tool(
        tier=ToolTier.COMPENSABLE,
        compensation=CompensationDescriptor.new(undo_broken),
        client=client,
    )
    async def write_broken(n: int) -> dict[str, Any]:
        raise Boom(f"write {n} failed")

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(Boom, match="write 2 failed"):
        async with session:
            await write_ok(1, _session=session)
            await write_broken(2, _session=session)

    assert ledger.names() == [undo_ok]
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"
    assert effect_states(view) == {"write_ok": "compensated", "write_broken": "failed"}
    entries = entries_by_fn(view)
    assert (entries[undo_broken]["state"], entries[undo_broken]["attempts"]) == ("skipped", 0)
    assert entries[undo_ok]["state"] == "compensated"


# --- on demand, empty, completed, left open -----------------------------------------------------


async def test_rollback_on_demand_returns_compensated_and_a_second_one_runs_nothing_again(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a = ledger.register("undo_a")
    write_a = write_tool(client, "write_a", undo_a)
    session = UndoLogSession(org_id=proxy.org_id)

    async with session:
        await write_a(1, _session=session)
        assert await session.rollback() == "compensated"
        assert await session.rollback() == "compensated"

    assert ledger.names() == [undo_a]
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"  # the block's normal end did not complete it
    assert effect_states(view) == {"write_a": "compensated"}


async def test_a_session_with_nothing_on_its_undo_stack_rolls_back_to_empty_undo_stack(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def delete_database(db_name: str) -> dict[str, Any]:
        return {"deleted": db_name}

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(AwaitingApprovalError):
        await delete_database("staging", _session=session)

    assert await session.rollback() == "empty_undo_stack"
    view = session_view(proxy, session.session_id)
    assert (view["state"], view["undo_stack"]) == ("compensated", [])


async def test_a_block_that_ends_normally_completes_the_session_and_later_calls_are_refused(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a = ledger.register("undo_a")
    runs: list[int] = []

    @undolog_tool(
        tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(undo_a), client=client
    )
    async def write_a(n: int) -> dict[str, Any]:
        runs.append(n)
        return {"n": n}

    session = UndoLogSession(org_id=proxy.org_id)
    async with session:
        await write_a(1, _session=session)

    view = session_view(proxy, session.session_id)
    assert view["state"] == "completed"
    assert effect_states(view) == {"write_a": "committed"}

    with pytest.raises(SessionClosed) as refused:
        await write_a(2, _session=session)
    assert isinstance(refused.value, ProxyError)
    assert (refused.value.response.status_code, refused.value.code) == (409, "session_closed")
    assert runs == [1]
    assert ledger.calls == []


async def test_awaiting_approval_leaving_the_block_keeps_the_session_active_for_a_resume(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_a = ledger.register("undo_a")
    write_a = write_tool(client, "write_a", undo_a)

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def delete_database(db_name: str) -> dict[str, Any]:
        return {"deleted": db_name}

    async def agent(session: UndoLogSession) -> None:
        async with session:
            await write_a(1, _session=session)
            await delete_database("staging", _session=session)

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(AwaitingApprovalError) as waiting:
        await agent(session)

    view = session_view(proxy, session.session_id)
    assert view["state"] == "active"
    assert effect_states(view) == {"write_a": "committed", "delete_database": "awaiting_approval"}
    assert ledger.calls == []

    await decide_approval(proxy, waiting.value.approval_id)
    await agent(UndoLogSession(org_id=proxy.org_id, session_id=session.session_id))
    view = session_view(proxy, session.session_id)
    assert view["state"] == "completed"
    assert effect_states(view) == {"write_a": "committed", "delete_database": "committed"}


# --- a mixed stack ------------------------------------------------------------------------------


async def test_a_mixed_stack_runs_local_and_proxy_compensations_in_exact_lifo_order(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """A (SDK) at step 1, B (send_email, run by the proxy) at step 2, C (SDK) at step 3: the
    rollback undoes C here, then B on the upstream, then A here. Each local compensation looks
    at the upstream's call log when it runs, which orders it against B's undo."""
    session = UndoLogSession(org_id=proxy.org_id)
    seen_by: dict[str, int] = {}

    def undo_emails_so_far(label: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def check() -> None:
            async with httpx.AsyncClient(base_url=proxy.upstream_url) as upstream:
                calls = (await upstream.get("/calls")).json()
            seen_by[label] = sum(
                c["tool"] == "undo_send_email" and c["session_id"] == session.session_id
                for c in calls
            )

        return check

    ledger = Ledger()
    undo_a = ledger.register("undo_a", check=undo_emails_so_far("a"))
    undo_c = ledger.register("undo_c", check=undo_emails_so_far("c"))
    write_a = write_tool(client, "write_a", undo_a)
    write_c = write_tool(client, "write_c", undo_c)

    with pytest.raises(Boom):
        async with session:
            await write_a(1, _session=session)
            step = session.next_step()  # the proxy-run call takes the session's next step
            with proxy.client() as proxy_client:
                sent = proxy_client.post(
                    "/mcp/tool_call",
                    json={
                        "session_id": session.session_id,
                        "tool_name": "send_email",
                        "step_index": step,
                        "args": EMAIL,
                    },
                )
            assert (sent.status_code, sent.json()["status"]) == (200, "executed"), sent.text
            await write_c(3, _session=session)
            raise Boom("undo everything")

    assert step == 2
    assert ledger.names() == [undo_c, undo_a]
    assert seen_by == {"c": 0, "a": 1}  # C before B's undo, A after it
    [undone] = upstream_calls(proxy, session.session_id, "undo_send_email")
    message_id = sent.json()["result"]["output"]["message_id"]
    assert undone["args"]["original_result"]["output"]["message_id"] == message_id
    with proxy.upstream() as upstream:
        assert upstream.get("/state").json()["messages"][message_id]["status"] == "recalled"
    view = session_view(proxy, session.session_id)
    assert [(e["step_index"], e["tool_name"], e["state"]) for e in view["effects"]] == [
        (1, "write_a", "compensated"),
        (2, "send_email", "compensated"),
        (3, "write_c", "compensated"),
    ]
    assert view["state"] == "compensated"


# --- retries and escalation ---------------------------------------------------------------------


async def test_a_compensation_that_fails_twice_then_succeeds_runs_three_times(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_flaky = ledger.register("undo_flaky", fail_times=2)
    write_a = write_tool(client, "write_a", undo_flaky, max_retries=3, retry_backoff_ms=1)
    session = UndoLogSession(org_id=proxy.org_id)

    async with session:
        result = await write_a(1, _session=session)
        assert await session.rollback() == "compensated"

    assert ledger.names() == [undo_flaky] * 3
    expected = {"original_args": {"n": 1}, "original_result": result}
    assert ledger.payloads(undo_flaky) == [expected] * 3
    view = session_view(proxy, session.session_id)
    [entry] = view["undo_stack"]
    assert (entry["state"], entry["attempts"], entry["last_error"]) == ("compensated", 3, None)
    assert effect_states(view) == {"write_a": "compensated"}
    assert view["state"] == "compensated"


async def test_a_compensation_that_never_succeeds_escalates_and_an_operator_resolve_lets_it_finish(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_ok, undo_never = ledger.register("undo_ok"), ledger.register("undo_never", fail_times=-1)
    write_ok = write_tool(client, "write_ok", undo_ok)
    write_never = write_tool(client, "write_never", undo_never, max_retries=2)
    session = UndoLogSession(org_id=proxy.org_id)
    await write_ok(1, _session=session)
    await write_never(2, _session=session)

    with pytest.raises(CompensationFailed) as gave_up:
        await session.rollback()

    assert isinstance(gave_up.value, ProxyError)
    assert gave_up.value.response.status_code == 502
    assert (gave_up.value.fn_name, gave_up.value.retries) == (undo_never, 2)
    assert gave_up.value.reason == f"RuntimeError: {undo_never} cannot undo this yet"
    assert ledger.names() == [undo_never] * 3  # max_retries 2: three attempts
    view = session_view(proxy, session.session_id)
    entries = entries_by_fn(view)
    assert (entries[undo_never]["state"], entries[undo_never]["attempts"]) == ("failed", 3)
    assert (entries[undo_ok]["state"], entries[undo_ok]["attempts"]) == ("pending", 0)
    assert effect_states(view) == {"write_ok": "committed", "write_never": "compensation_failed"}
    assert view["state"] == "compensation_failed"

    # Asking again before an operator acts runs nothing and raises the same error.
    with pytest.raises(CompensationFailed) as again:
        await session.rollback()
    assert (again.value.fn_name, again.value.retries) == (undo_never, 2)
    assert ledger.names() == [undo_never] * 3

    with proxy.client() as operator:
        resolved = operator.post(
            f"/undo/{entries[undo_never]['entry_id']}/resolve",
            json={"note": "recalled by hand"},
        )
    assert resolved.status_code == 200, resolved.text

    assert await session.rollback() == "compensated"
    assert ledger.names() == [undo_never] * 3 + [undo_ok]
    view = session_view(proxy, session.session_id)
    entries = entries_by_fn(view)
    assert (entries[undo_never]["state"], entries[undo_never]["last_error"]) == (
        "resolved",
        "resolved by key:admin: recalled by hand",  # who resolved it, from the key
    )
    assert entries[undo_ok]["state"] == "compensated"
    assert effect_states(view) == {"write_ok": "compensated", "write_never": "compensated"}
    assert view["state"] == "compensated"


async def test_a_rollback_that_gives_up_in_a_raising_block_is_a_note_on_the_block_s_error(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    undo_ok, undo_never = ledger.register("undo_ok"), ledger.register("undo_never", fail_times=-1)
    write_ok = write_tool(client, "write_ok", undo_ok)
    write_never = write_tool(client, "write_never", undo_never, max_retries=1)
    boom = Boom("the agent gave up")
    session = UndoLogSession(org_id=proxy.org_id)

    with pytest.raises(Boom) as raised:
        async with session:
            await write_ok(1, _session=session)
            await write_never(2, _session=session)
            raise boom

    assert raised.value is boom
    [note] = boom.__notes__
    assert note.startswith("UndoLog rollback did not finish: ")
    assert "CompensationFailed" in note and undo_never in note
    assert ledger.names() == [undo_never] * 2
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensation_failed"
    assert effect_states(view) == {"write_ok": "committed", "write_never": "compensation_failed"}


async def test_a_compensation_with_no_registered_function_escalates_after_its_retries(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    missing = f"undo_missing_{uuid.uuid4().hex[:8]}"
    write_a = write_tool(client, "write_a", missing, max_retries=2)
    session = UndoLogSession(org_id=proxy.org_id)
    await write_a(1, _session=session)

    with pytest.raises(CompensationFailed) as gave_up:
        await session.rollback()

    message = f"no compensation named '{missing}' is registered in this agent"
    assert (gave_up.value.fn_name, gave_up.value.reason) == (missing, message)
    view = session_view(proxy, session.session_id)
    [entry] = view["undo_stack"]
    assert (entry["state"], entry["attempts"], entry["last_error"]) == ("failed", 3, message)
    assert view["state"] == "compensation_failed"


# --- what leaves a session alone, and concurrent runners ----------------------------------------


async def test_a_block_whose_calls_never_reached_the_proxy_neither_completes_nor_rolls_back(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    ledger = Ledger()
    write_a = write_tool(client, "write_a", ledger.register("undo_a"))
    session = UndoLogSession(org_id=proxy.org_id)

    async with session:  # ends normally: nothing to complete, and no error from the exit
        with pytest.raises(ValueError):
            await write_a(float("nan"), _session=session)  # refused before the proxy is asked
    boom = Boom("after a refused call")
    with pytest.raises(Boom) as raised:
        async with session:
            with pytest.raises(ValueError):
                await write_a(float("inf"), _session=session)
            raise boom

    assert raised.value is boom
    assert not getattr(boom, "__notes__", None)  # no rollback of a session nobody recorded
    with proxy.client() as c:
        assert c.get(f"/sessions/{session.session_id}").status_code == 404
    assert ledger.calls == []


async def test_siblings_in_a_task_group_are_failed_before_the_rollback_which_skips_them(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """A TaskGroup cancels the still-running sibling of a tool that raised: the cancelled
    call is recorded as failed, so the rollback skips it instead of stopping at it."""
    ledger = Ledger()
    undo_slow, undo_bad = ledger.register("undo_slow"), ledger.register("undo_bad")
    never = asyncio.Event()

    @undolog_tool(
        tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(undo_slow), client=client
    )
    async def slow_write(n: int) -> dict[str, Any]:
        await never.wait()  # still running when its sibling fails; cancelled by the group
        return {"n": n}

    @undolog_tool(
        tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(undo_bad), client=client
    )
    async def bad_write(n: int) -> dict[str, Any]:
        raise Boom(f"write {n} failed")

    session = UndoLogSession(org_id=proxy.org_id)
    with pytest.raises(ExceptionGroup) as raised:
        async with session, asyncio.TaskGroup() as group:
            group.create_task(slow_write(1, _session=session))
            group.create_task(bad_write(2, _session=session))

    assert raised.group_contains(Boom)
    assert not getattr(raised.value, "__notes__", None)
    view = session_view(proxy, session.session_id)
    assert view["state"] == "compensated"
    assert effect_states(view) == {"slow_write": "failed", "bad_write": "failed"}
    assert [u["state"] for u in view["undo_stack"]] == ["skipped", "skipped"]
    assert ledger.calls == []


class HeldAnswerClient(UndoLogClient):
    """A client whose intercept, once the proxy has answered, holds the answer until `release`
    is set: the caller can be cancelled while, as far as it knows, the request is in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered = asyncio.Event()
        self.release = asyncio.Event()

    async def intercept(self, *args: Any, **kwargs: Any) -> Any:
        answer = await super().intercept(*args, **kwargs)
        self.answered.set()
        await self.release.wait()
        return answer


async def test_a_call_cancelled_while_its_intercept_is_in_flight_is_recorded_as_not_run(
    proxy: ProxyHarness,
) -> None:
    """Cancelled after the proxy recorded the intent but before the SDK had its answer, the
    body never ran: the SDK waits for the answer and reports the call failed, so it is never
    left in doubt (nor its undo entry run)."""
    ledger = Ledger()
    undo_write = ledger.register("undo_cancelled_write")
    ran = []
    held = HeldAnswerClient(proxy.url, api_key=proxy.api_key)

    @undolog_tool(
        tier=ToolTier.COMPENSABLE, compensation=CompensationDescriptor.new(undo_write), client=held
    )
    async def cancelled_write(n: int) -> dict[str, Any]:
        ran.append(n)
        return {"n": n}

    session = UndoLogSession(org_id=proxy.org_id)
    try:
        task = asyncio.create_task(cancelled_write(1, _session=session))
        await asyncio.wait_for(held.answered.wait(), 30)
        task.cancel()
        held.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await held.aclose()

    assert ran == []
    view = session_view(proxy, session.session_id)
    (effect,) = view["effects"]
    assert effect["state"] == "failed"
    assert "cancelled" in json.dumps(effect)


class GatedClient(UndoLogClient):
    """A client whose first claim waits for `before_claim`, and which signals `answered` once
    the proxy has told it to run an entry: a test can line two runners up on one entry."""

    def __init__(self, *args: Any, before_claim: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.before_claim = before_claim
        self.answered = asyncio.Event()
        self.claims: list[str] = []

    async def rollback_session(self, org_id: str, session_id: str) -> dict[str, Any]:
        answer = await super().rollback_session(org_id, session_id)
        if answer["outcome"] == "waiting_for_runner":
            self.answered.set()
        return answer

    async def claim_undo(self, org_id: str, entry_id: str) -> dict[str, Any]:
        if not self.claims:
            await asyncio.wait_for(self.before_claim.wait(), 30)
        self.claims.append(entry_id)
        return await super().claim_undo(org_id, entry_id)


async def test_two_runners_handed_the_same_entry_run_each_compensation_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    """Both runners are told to run the top entry; the first claims it, the second's claim
    comes while it runs. The loser waits for the winner and both end compensated."""
    started = asyncio.Event()
    ledger = Ledger()

    async def mark_started() -> None:
        started.set()

    undo_old = ledger.register("undo_old")
    undo_top = ledger.register("undo_top", check=mark_started)
    write_old = write_tool(client, "write_old", undo_old)
    write_top = write_tool(client, "write_top", undo_top)
    session = UndoLogSession(org_id=proxy.org_id)
    await write_old(1, _session=session)
    await write_top(2, _session=session)

    second_seen = asyncio.Event()
    first = GatedClient(proxy.url, api_key=proxy.api_key, before_claim=second_seen)
    second = GatedClient(proxy.url, api_key=proxy.api_key, before_claim=started)
    second.answered = second_seen  # the first claims once the second has its answer too
    runners = [
        UndoLogSession(org_id=proxy.org_id, session_id=session.session_id, client=c)
        for c in (first, second)
    ]
    try:
        outcomes = await asyncio.gather(*(runner.rollback() for runner in runners))
    finally:
        await first.aclose()
        await second.aclose()

    assert outcomes == ["compensated", "compensated"]
    assert ledger.names() == [undo_top, undo_old]
    assert first.claims[0] == second.claims[0]  # both went for the top entry
    view = session_view(proxy, session.session_id)
    assert [(u["fn_name"], u["state"], u["attempts"]) for u in view["undo_stack"]] == [
        (undo_top, "compensated", 1),
        (undo_old, "compensated", 1),
    ]


# --- the example ----------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollback.py"


@pytest.mark.slow
def test_the_rollback_example_undoes_its_charge_then_its_seat_and_exits_1(
    proxy: ProxyHarness,
) -> None:
    env = {
        **os.environ,
        "UNDOLOG_PROXY_URL": proxy.url,
        "UNDOLOG_API_KEY": proxy.api_key,
        "UNDOLOG_ORG_ID": proxy.org_id,
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr) == (1, "")
    lines = done.stdout.splitlines()
    session_id = lines[0].split()[1]
    charge = next(line for line in lines if line.startswith("charge_card -> "))
    charge_id = json.loads(charge.split(" -> ", 1)[1])["charge_id"]
    assert [line for line in lines if line.startswith(("[undo]", "booking failed"))] == [
        f"[undo] refund_charge {charge_id} (trip not booked)",
        "[undo] release_seat 14C on LH 404",
        "booking failed: the airline refused the ticket; the session was rolled back",
    ]
    view = session_view(proxy, session_id)
    assert view["state"] == "compensated"
    assert effect_states(view) == {
        "reserve_seat": "compensated",
        "charge_card": "compensated",
        "issue_ticket": "failed",
    }
