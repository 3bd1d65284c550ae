"""`@undolog_tool` and `UndoLogClient` against a real proxy (uvicorn on loopback), both stores.

Every outcome of the reference's flow: SAFE runs locally; COMPENSABLE and IRREVERSIBLE calls
intercept and then Execute (run, commit or fail), Replay (the body is not entered) or wait for
approval (the body is not entered). Plus what a tool sees (its effect id), what it may return,
and the typed errors an agent can act on.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import decide_approval, session_view
from tests.support.servers import free_port
from undolog_sdk import (
    AwaitingApprovalError,
    CompensationDescriptor,
    ProxyError,
    ToolTier,
    UndoLogClient,
    UndoLogSession,
    current_effect_id,
    undolog_tool,
)
from undolog_sdk import client as client_module
from undolog_sdk.errors import (
    ApprovalRejected,
    AuthFailed,
    InProgress,
    ToolNotRegistered,
    UndoLogError,
)

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

UNDO = CompensationDescriptor.new("undo_it")

# The tools here are named after the demo tools the harness registers, with compensations of
# their own: the code's compensation applies, with a `TierMismatchWarning` that is the subject
# of tests/sdk/test_tiers.py, not of these tests.
pytestmark = pytest.mark.filterwarnings("ignore::undolog_sdk.TierMismatchWarning")


def closed_port_client() -> UndoLogClient:
    """A client whose proxy does not exist: any request to it fails to connect."""
    return UndoLogClient(f"http://127.0.0.1:{free_port()}", api_key="unused")


@pytest.fixture
async def client(proxy: ProxyHarness) -> AsyncIterator[UndoLogClient]:
    sdk_client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


@pytest.fixture
async def offline() -> AsyncIterator[UndoLogClient]:
    sdk_client = closed_port_client()
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


@pytest.fixture
def session(proxy: ProxyHarness) -> UndoLogSession:
    return UndoLogSession(org_id=proxy.org_id)


def same_session(session: UndoLogSession) -> UndoLogSession:
    """The same session as seen by a restarted agent: same ids, step counter from zero."""
    return UndoLogSession(org_id=session.org_id, session_id=session.session_id)


# --- decoration ---------------------------------------------------------------------------


def test_a_compensable_tool_without_a_compensation_is_refused_when_decorated() -> None:
    with pytest.raises(ValueError):
        undolog_tool(tier=ToolTier.COMPENSABLE)


@pytest.mark.parametrize("tier", [ToolTier.SAFE, ToolTier.IRREVERSIBLE])
def test_other_tiers_need_no_compensation(tier: ToolTier) -> None:
    @undolog_tool(tier=tier)
    async def tool() -> None:
        return None


def test_a_plain_function_is_refused_when_decorated() -> None:
    def not_async() -> None:
        return None

    with pytest.raises(TypeError):
        undolog_tool(tier=ToolTier.SAFE)(not_async)  # type: ignore[arg-type]


def test_the_decorated_function_keeps_its_name_docstring_and_signature() -> None:
    async def send_email(
        to: str, subject: str = "hi", *, cc: list[str] | None = None
    ) -> dict[str, str]:
        """Send an email."""
        return {"status": "sent"}

    wrapped = undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO)(send_email)
    assert wrapped.__name__ == "send_email"
    assert wrapped.__qualname__ == send_email.__qualname__
    assert wrapped.__doc__ == "Send an email."
    assert inspect.signature(wrapped) == inspect.signature(send_email)
    assert inspect.iscoroutinefunction(wrapped)


# --- SAFE ---------------------------------------------------------------------------------


async def test_a_safe_tool_runs_locally_asking_the_proxy_only_for_the_registry_once(
    proxy: ProxyHarness, client: UndoLogClient
) -> None:
    runs: list[str] = []
    requests: list[str] = []
    client._http.event_hooks["request"].append(
        lambda request: _note(requests, f"{request.method} {request.url.path}")
    )

    @undolog_tool(tier=ToolTier.SAFE, client=client)
    async def look_it_up(query: str) -> str:
        runs.append(query)
        return f"results for {query}"

    session = UndoLogSession(org_id=proxy.org_id)
    assert await look_it_up("undo", _session=session) == "results for undo"
    assert await look_it_up("undo", _session=session) == "results for undo"
    assert await look_it_up(query="no session") == "results for no session"
    assert runs == ["undo", "undo", "no session"]
    assert session._step_index == 0  # SAFE calls take no step
    assert requests == ["GET /tools"]  # the registry, once: it does not hold the tool


async def _note(requests: list[str], line: str) -> None:
    requests.append(line)


async def test_a_safe_tool_outside_a_session_runs_without_a_proxy_and_inside_one_fails_closed(
    offline: UndoLogClient,
) -> None:
    """Inside a session, a SAFE tool is gated if the registry holds it at a stricter tier: a
    registry that cannot be read cannot say it is not, so the call does not run."""
    runs: list[str] = []

    @undolog_tool(tier=ToolTier.SAFE, client=offline)
    async def search_web(query: str) -> str:
        runs.append(query)
        return f"results for {query}"

    assert await search_web(query="no session") == "results for no session"
    with pytest.raises(httpx.ConnectError):
        await search_web("undo", _session=UndoLogSession(org_id="org-nowhere"))
    assert runs == ["no session"]


# --- the session argument -------------------------------------------------------------------


async def test_a_missing_session_is_a_runtime_error_before_anything_happens(
    offline: UndoLogClient,
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=offline)
    async def send_email(to: str) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {"status": "sent"}

    with pytest.raises(RuntimeError, match="_session"):
        await send_email("ada@example.com")
    with pytest.raises(RuntimeError):
        await send_email("ada@example.com", _session="not a session")
    assert runs == 0


async def test_arguments_that_are_not_json_are_refused_before_the_proxy_is_asked(
    offline: UndoLogClient,
) -> None:
    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=offline)
    async def publish(payload: Any) -> None:
        return None

    session = UndoLogSession(org_id="org-nowhere")
    with pytest.raises(ValueError, match="payload"):
        await publish({1, 2}, _session=session)
    with pytest.raises(ValueError):
        await publish(float("nan"), _session=session)
    assert session._step_index == 0


async def test_a_session_id_that_is_not_a_uuid_is_refused_before_the_proxy_is_asked(
    offline: UndoLogClient,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=offline)
    async def send_email(to: str) -> None:
        return None

    session = UndoLogSession(org_id="org-nowhere", session_id="run-42")
    with pytest.raises(ValueError, match="UUID"):
        await send_email("ada", _session=session)
    assert session._step_index == 0


async def test_a_custom_session_param_carries_the_session(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client, session_param="ctx")
    async def create_record(name: str) -> dict[str, str]:
        return {"created": name}

    assert await create_record("r1", ctx=session) == {"created": "r1"}
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert effect["args"] == {"name": "r1"}  # the session is not an argument of the call


async def test_a_tool_that_declares_the_session_parameter_receives_the_session(
    client: UndoLogClient, session: UndoLogSession
) -> None:
    seen: list[UndoLogSession] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def create_record(name: str, _session: UndoLogSession) -> str:
        seen.append(_session)
        return name

    assert await create_record("r1", _session=session) == "r1"
    assert seen == [session]


# --- Execute: run the body, then commit -----------------------------------------------------


async def test_a_compensable_call_executes_once_and_commits_its_result(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    runs = 0

    @undolog_tool(
        tier=ToolTier.COMPENSABLE,
        compensation=CompensationDescriptor.new("undo_send_email", {"reason": "rollback"}),
        client=client,
    )
    async def send_email(to: str, subject: str) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {"status": "sent", "message_id": "msg-1"}

    async with session:
        result = await send_email(to="ada@example.com", subject="hello", _session=session)
    assert result == {"status": "sent", "message_id": "msg-1"}
    assert runs == 1

    view = session_view(proxy, session.session_id)
    (effect,) = view["effects"]
    assert effect["tool_name"] == "send_email"
    assert effect["step_index"] == 1
    assert effect["state"] == "committed"
    assert effect["mode"] == "sdk"
    assert effect["attempts"] == 1
    assert effect["args"] == {"to": "ada@example.com", "subject": "hello"}
    assert effect["result"] == result
    (entry,) = view["undo_stack"]
    assert (entry["effect_id"], entry["fn_name"]) == (effect["effect_id"], "undo_send_email")
    assert entry["args"] == {"reason": "rollback"}

    with proxy.client() as c:
        tools = {t["name"]: t for t in c.get("/tools").json()}
    assert tools["send_email"]["tier"] == "compensable"  # registered on first use
    assert tools["send_email"]["compensation"]["fn_name"] == "undo_send_email"


async def test_calls_take_steps_one_two_three_in_order(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def create_record(name: str) -> str:
        return name

    for name in ("a", "b", "c"):
        await create_record(name, _session=session)
    effects = session_view(proxy, session.session_id)["effects"]
    assert [(e["step_index"], e["args"]["name"]) for e in effects] == [
        (1, "a"),
        (2, "b"),
        (3, "c"),
    ]


async def test_calls_started_together_take_their_steps_in_the_order_they_were_started(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    # A restarted agent must give each call the same step again, whatever the network does:
    # here the first call still has to register its tool, the second one does not.
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def known(name: str) -> str:
        return name

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def fresh(name: str) -> str:
        return name

    await known("warm-up", _session=UndoLogSession(org_id=proxy.org_id))
    assert await asyncio.gather(fresh("x", _session=session), known("y", _session=session)) == [
        "x",
        "y",
    ]
    effects = session_view(proxy, session.session_id)["effects"]
    assert [(e["step_index"], e["tool_name"]) for e in effects] == [(1, "fresh"), (2, "known")]


# --- Replay: the recorded value, the body is not entered ------------------------------------


async def test_the_same_call_again_in_the_same_session_replays_without_entering_the_body(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def transfer_funds(amount: int, to: str = "acct-2") -> dict[str, Any]:
        nonlocal runs
        runs += 1
        return {"transfer_id": f"t-{runs}", "amount": amount}

    first = await transfer_funds(100, _session=session)
    # A restarted agent: same session id, steps from the start; positional or keyword, with
    # or without the default, it is the same call.
    again = await transfer_funds(amount=100, to="acct-2", _session=same_session(session))
    assert again == first == {"transfer_id": "t-1", "amount": 100}
    assert runs == 1
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert effect["replay_count"] == 1
    assert effect["attempts"] == 1


async def test_a_changed_argument_is_a_different_call_that_executes(
    client: UndoLogClient, session: UndoLogSession
) -> None:
    runs: list[int] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def transfer_funds(amount: int) -> int:
        runs.append(amount)
        return amount

    await transfer_funds(100, _session=session)
    await transfer_funds(200, _session=same_session(session))
    assert runs == [100, 200]


@pytest.mark.parametrize(
    ("returned", "replayed"),
    [
        ({"nested": {"list": [1, 2.5, None, True]}, "text": "Zoë 🙂"}, None),
        ([1, "two", {"three": 3.0}], None),
        ("plain text", None),
        (42, None),
        (0.1, None),
        (1e16, None),
        (False, None),
        (None, None),
        ((1, 2), [1, 2]),  # a tuple is a JSON array: it comes back as a list
    ],
)
async def test_any_json_value_a_tool_returns_round_trips_through_a_replay(
    client: UndoLogClient, session: UndoLogSession, returned: Any, replayed: Any
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def produce() -> Any:
        nonlocal runs
        runs += 1
        return returned

    assert await produce(_session=session) == returned
    value = await produce(_session=same_session(session))
    assert value == (returned if replayed is None else replayed)
    assert type(value) is type(returned if replayed is None else replayed)
    assert runs == 1


async def test_a_result_that_is_not_json_fails_the_call_and_a_retry_is_a_new_attempt(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    returns: list[Any] = [object(), {"ok": True}]

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def create_record() -> Any:
        return returns.pop(0)

    with pytest.raises(TypeError, match="not JSON"):
        await create_record(_session=session)
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert effect["state"] == "failed"
    assert "not JSON" in effect["error"]

    assert await create_record(_session=session) == {"ok": True}
    (again,) = session_view(proxy, session.session_id)["effects"]
    assert (again["effect_id"], again["state"], again["attempts"]) == (
        effect["effect_id"],
        "committed",
        2,
    )


# --- a tool that raises: fail, re-raise; the retry is a new attempt of the same effect --------


async def test_a_tool_error_fails_the_effect_and_is_re_raised_and_a_retry_runs_again(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    class PaymentDeclined(Exception):
        pass

    declined = PaymentDeclined("card declined")
    keys: list[str | None] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def charge_card(amount: int) -> dict[str, Any]:
        keys.append(current_effect_id())
        if len(keys) == 1:
            raise declined
        return {"charged": amount}

    with pytest.raises(PaymentDeclined) as caught:
        await charge_card(30, _session=session)
    assert caught.value is declined  # the tool's own exception, untouched
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert effect["state"] == "failed"
    assert effect["error"] == "PaymentDeclined: card declined"
    assert effect["attempts"] == 1

    assert await charge_card(30, _session=session) == {"charged": 30}
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert (effect["state"], effect["attempts"], effect["step_index"]) == ("committed", 2, 1)
    # The effect id is the idempotency key: the same for both attempts of the call.
    assert keys == [effect["effect_id"], effect["effect_id"]]


# --- the effect id inside a tool --------------------------------------------------------------


async def test_current_effect_id_is_the_recorded_effect_inside_the_tool_and_none_outside(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def transfer_funds(amount: int) -> dict[str, Any]:
        return {"idempotency_key": current_effect_id()}

    @undolog_tool(tier=ToolTier.SAFE, client=client)
    async def lookup() -> str | None:
        return current_effect_id()

    assert current_effect_id() is None
    first = await transfer_funds(1, _session=session)
    second = await transfer_funds(2, _session=session)
    assert current_effect_id() is None
    assert await lookup(_session=session) is None  # a SAFE call has no effect
    effects = session_view(proxy, session.session_id)["effects"]
    assert [first["idempotency_key"], second["idempotency_key"]] == [
        e["effect_id"] for e in effects
    ]


async def test_concurrent_tools_each_see_their_own_effect_id(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    both_inside = asyncio.Barrier(2)

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def create_record(name: str) -> str | None:
        await asyncio.wait_for(both_inside.wait(), 10)
        return current_effect_id()

    keys = await asyncio.gather(
        create_record("a", _session=session), create_record("b", _session=session)
    )
    effects = session_view(proxy, session.session_id)["effects"]
    by_name = {e["args"]["name"]: e["effect_id"] for e in effects}
    assert list(keys) == [by_name["a"], by_name["b"]]


# --- AwaitingApproval ---------------------------------------------------------------------------


async def test_an_irreversible_call_waits_for_approval_without_entering_the_body(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def delete_database(db_name: str) -> dict[str, str]:
        nonlocal runs
        runs += 1
        return {"status": "deleted", "db": db_name}

    with pytest.raises(AwaitingApprovalError) as caught:
        await delete_database("prod", _session=session)
    waiting = caught.value
    assert isinstance(waiting, RuntimeError)
    assert (waiting.tool_name, waiting.step_index) == ("delete_database", 1)
    assert waiting.retry_after == proxy.settings.retry_after_seconds
    assert runs == 0
    view = session_view(proxy, session.session_id)
    (approval,) = view["approvals"]
    assert approval["id"] == waiting.approval_id
    assert approval["status"] == "pending"
    assert view["effects"][0]["state"] == "awaiting_approval"

    # Asking again before anyone decided: the same approval, still no run.
    with pytest.raises(AwaitingApprovalError) as again:
        await delete_database("prod", _session=session)
    assert (again.value.approval_id, again.value.step_index) == (waiting.approval_id, 1)
    assert runs == 0

    await decide_approval(proxy, waiting.approval_id)
    assert await delete_database("prod", _session=session) == {"status": "deleted", "db": "prod"}
    assert runs == 1
    # And from now on it replays.
    assert await delete_database("prod", _session=same_session(session)) == {
        "status": "deleted",
        "db": "prod",
    }
    assert runs == 1
    (effect,) = session_view(proxy, session.session_id)["effects"]
    assert (effect["state"], effect["attempts"]) == ("committed", 1)


async def test_a_rejected_approval_is_a_typed_error_and_the_body_never_runs(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.IRREVERSIBLE, client=client)
    async def publish_to_production(version: str) -> None:
        nonlocal runs
        runs += 1

    with pytest.raises(AwaitingApprovalError) as caught:
        await publish_to_production("1.2.3", _session=session)
    await decide_approval(proxy, caught.value.approval_id, "rejected")
    with pytest.raises(ApprovalRejected) as rejected:
        await publish_to_production("1.2.3", _session=session)
    assert rejected.value.code == "approval_rejected"
    assert rejected.value.approval_id == caught.value.approval_id
    assert isinstance(rejected.value, ProxyError)
    assert rejected.value.response.status_code == 409
    assert runs == 0


# --- InterceptResponse, field by field -----------------------------------------------------------


async def test_intercept_fills_the_response_fields_each_outcome_has(
    client: UndoLogClient,
    session: UndoLogSession,
    proxy: ProxyHarness,
) -> None:
    org, sid = proxy.org_id, session.session_id
    await client.register_tool(org, "send_email", "compensable", UNDO.to_dict())
    await client.register_tool(org, "delete_database", "irreversible")

    execute = await client.intercept(org, sid, "send_email", 1, {"to": "ada"})
    assert execute.outcome == "Execute"
    uuid.UUID(execute.effect_id or "")
    assert (execute.approval_id, execute.cached_result) == (None, None)

    assert execute.effect_id is not None
    await client.commit(org, sid, execute.effect_id, {"message_id": "m-1"})
    replay = await client.intercept(org, sid, "send_email", 1, {"to": "ada"})
    assert (replay.outcome, replay.effect_id) == ("Replay", execute.effect_id)
    assert replay.cached_result == {"message_id": "m-1"}
    assert replay.approval_id is None

    waiting = await client.intercept(org, sid, "delete_database", 2, {"db_name": "prod"})
    assert waiting.outcome == "AwaitingApproval"
    uuid.UUID(waiting.effect_id or "")
    uuid.UUID(waiting.approval_id or "")
    assert waiting.cached_result is None
    assert waiting.retry_after == proxy.settings.retry_after_seconds


# --- typed errors -----------------------------------------------------------------------------


async def test_an_unregistered_tool_is_a_typed_tool_not_registered_error(
    client: UndoLogClient,
    session: UndoLogSession,
    proxy: ProxyHarness,
) -> None:
    with pytest.raises(ToolNotRegistered) as caught:
        await client.intercept(proxy.org_id, session.session_id, "never_registered", 1, {})
    error = caught.value
    assert isinstance(error, ProxyError)
    assert isinstance(error, httpx.HTTPStatusError)
    assert isinstance(error, UndoLogError)
    assert error.code == "tool_not_registered"
    assert error.response.status_code == 404
    assert error.request_id == error.response.headers["X-Request-Id"]
    assert error.tool_name == "never_registered"
    assert "never_registered" in error.message


async def test_code_written_against_the_reference_catches_proxy_errors_as_http_errors(
    client: UndoLogClient,
    session: UndoLogSession,
    proxy: ProxyHarness,
) -> None:
    try:
        await client.intercept(proxy.org_id, session.session_id, "never_registered", 1, {})
    except httpx.HTTPStatusError as exc:
        assert exc.response.status_code == 404
    else:  # pragma: no cover
        pytest.fail("no error raised")


async def test_a_concurrent_duplicate_is_in_progress_with_retry_after_and_later_replays(
    proxy: ProxyHarness,
    client: UndoLogClient,
    session: UndoLogSession,
) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    keys: list[str | None] = []

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def slow_charge(amount: int) -> dict[str, int]:
        keys.append(current_effect_id())
        started.set()
        await asyncio.wait_for(release.wait(), 10)
        return {"charged": amount}

    first = asyncio.create_task(slow_charge(5, _session=session))
    await asyncio.wait_for(started.wait(), 10)
    # A second replica of the agent runs the same session and reaches the same call.
    replica = same_session(session)
    with pytest.raises(InProgress) as caught:
        await slow_charge(5, _session=replica)
    error = caught.value
    assert isinstance(error, httpx.HTTPStatusError)
    assert error.code == "in_progress"
    assert error.response.status_code == 409
    assert 1 <= (error.retry_after or 0) <= proxy.settings.retry_after_seconds
    assert error.response.headers["Retry-After"] == str(error.retry_after)
    assert error.effect_id == keys[0]
    assert replica._step_index == 0  # the step is kept for the retry

    release.set()
    assert await asyncio.wait_for(first, 10) == {"charged": 5}
    assert await slow_charge(5, _session=replica) == {"charged": 5}
    assert len(keys) == 1


async def test_a_wrong_api_key_is_auth_failed_with_the_request_id(
    proxy: ProxyHarness,
    session: UndoLogSession,
) -> None:
    runs = 0
    bad = UndoLogClient(proxy.url, api_key="ul_wrong_key")
    try:
        with pytest.raises(ProxyError) as caught:
            await bad.intercept(proxy.org_id, session.session_id, "send_email", 1, {})

        @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=bad)
        async def send_email(to: str) -> None:
            nonlocal runs
            runs += 1

        with pytest.raises(AuthFailed):
            await send_email("ada", _session=session)
    finally:
        await bad.aclose()
    error = caught.value
    assert isinstance(error, AuthFailed)
    assert error.code == "auth_failed"
    assert error.response.status_code == 403
    assert error.request_id == error.response.headers["X-Request-Id"]
    assert runs == 0


async def test_an_org_id_that_is_not_the_keys_org_is_refused(
    client: UndoLogClient,
    proxy: ProxyHarness,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=client)
    async def send_email(to: str) -> None:
        return None

    with pytest.raises(AuthFailed) as caught:
        await send_email("ada", _session=UndoLogSession(org_id="someone-else"))
    assert isinstance(caught.value, ProxyError)
    assert caught.value.response.status_code == 403


async def test_an_unreachable_proxy_is_an_httpx_request_error_and_the_body_does_not_run(
    offline: UndoLogClient,
) -> None:
    runs = 0

    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO, client=offline)
    async def send_email(to: str) -> None:
        nonlocal runs
        runs += 1

    session = UndoLogSession(org_id="org-a")
    with pytest.raises(httpx.RequestError):
        await send_email("ada", _session=session)
    with pytest.raises(httpx.ConnectError):
        await offline.intercept("org-a", session.session_id, "send_email", 1, {})
    assert runs == 0
    assert session._step_index == 0


# --- the default client ---------------------------------------------------------------------


@pytest.fixture
def default_client_from_env(
    proxy: ProxyHarness,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    monkeypatch.setenv("UNDOLOG_PROXY_URL", proxy.url)
    monkeypatch.setenv("UNDOLOG_API_KEY", proxy.api_key)
    monkeypatch.setattr(client_module, "_default_client", None)
    yield


async def test_without_a_client_the_decorator_uses_a_default_one_from_the_environment(
    default_client_from_env: None,
    proxy: ProxyHarness,
    session: UndoLogSession,
) -> None:
    @undolog_tool(tier=ToolTier.COMPENSABLE, compensation=UNDO)
    async def create_record(name: str) -> str:
        return name

    try:
        assert await create_record("r1", _session=session) == "r1"
    finally:
        default = client_module._default_client
        assert default is not None
        await default.aclose()
    assert default.proxy_url == proxy.url
    assert session_view(proxy, session.session_id)["effects"][0]["state"] == "committed"
