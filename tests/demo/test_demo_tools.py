"""The demo tool server, driven over HTTP on a real uvicorn server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import await_until, free_port, serve_in_thread
from undolog.demo.tools import (
    DEFAULT_BALANCE,
    DemoToolState,
    create_demo_tools_app,
    run_demo_tools,
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[httpx.Client, DemoToolState]]:
    app = create_demo_tools_app(inspect=True)
    with serve_in_thread(app) as running, httpx.Client(base_url=running.url, timeout=10) as client:
        yield client, app.state.demo


@pytest.fixture
def client(server: tuple[httpx.Client, DemoToolState]) -> httpx.Client:
    http, state = server
    state.reset()
    return http


@pytest.fixture
def state(server: tuple[httpx.Client, DemoToolState], client: httpx.Client) -> DemoToolState:
    return server[1]


def call(
    client: httpx.Client,
    tool: str,
    args: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    effect_id: str | None = None,
    request_id: str | None = None,
) -> httpx.Response:
    headers = {}
    if key is not None:
        headers["Idempotency-Key"] = key
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    body = {"args": args or {}, "session_id": "s-1", "effect_id": effect_id}
    return client.post(f"/tools/{tool}", json=body, headers=headers)


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["success"] is True
    assert result["error"] is None
    return result["output"]


def failed(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    result = response.json()
    assert result["success"] is False
    assert result["output"] is None
    assert isinstance(result["error"], str)
    return str(result["error"])


# --- happy paths --------------------------------------------------------------------------------


def test_health_answers_ok(client: httpx.Client) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_send_email_returns_a_message_id_and_keeps_the_message(
    client: httpx.Client, state: DemoToolState
) -> None:
    output = ok(call(client, "send_email", {"to": "a@example.com", "subject": "Hi", "body": "x"}))
    assert output == {"message_id": "msg-1", "to": "a@example.com", "status": "sent"}
    message = client.get("/state").json()["messages"]["msg-1"]
    assert message == {
        "message_id": "msg-1",
        "to": "a@example.com",
        "subject": "Hi",
        "body": "x",
        "status": "sent",
    }
    assert state.messages["msg-1"]["status"] == "sent"


def test_transfer_funds_moves_money_between_accounts(client: httpx.Client) -> None:
    output = ok(
        call(
            client, "transfer_funds", {"from_account": "alice", "to_account": "bob", "amount": 250}
        )
    )
    assert output == {
        "transfer_id": "txn-1",
        "from_account": "alice",
        "to_account": "bob",
        "amount": 250,
    }
    snapshot = client.get("/state").json()
    assert snapshot["balances"] == {
        "alice": DEFAULT_BALANCE - 250,
        "bob": DEFAULT_BALANCE + 250,
    }
    assert snapshot["transfers"]["txn-1"]["status"] == "completed"


def test_a_balance_set_over_http_is_the_one_a_transfer_draws_on(client: httpx.Client) -> None:
    response = client.put("/balances/alice", json={"balance": 10})
    assert response.json() == {"account": "alice", "balance": 10}
    failed(
        call(
            client, "transfer_funds", {"from_account": "alice", "to_account": "bob", "amount": 11}
        ),
        422,
    )
    ok(call(client, "transfer_funds", {"from_account": "alice", "to_account": "bob", "amount": 10}))
    assert client.get("/state").json()["balances"]["alice"] == 0


def test_create_record_stores_the_record(client: httpx.Client) -> None:
    output = ok(call(client, "create_record", {"table": "users", "data": {"name": "Ada"}}))
    assert output == {"record_id": "rec-1"}
    assert client.get("/state").json()["records"]["rec-1"] == {
        "record_id": "rec-1",
        "table": "users",
        "data": {"name": "Ada"},
        "status": "active",
    }


def test_search_web_gives_the_same_results_for_the_same_query(client: httpx.Client) -> None:
    first = ok(call(client, "search_web", {"query": "undo logs"}))
    second = ok(call(client, "search_web", {"query": "undo logs"}))
    assert first == second
    assert first["query"] == "undo logs"
    assert len(first["results"]) == 3
    assert {"title", "url", "snippet"} <= set(first["results"][0])


def test_irreversible_tools_succeed_and_are_recorded(client: httpx.Client) -> None:
    assert ok(call(client, "delete_database", {"db_name": "prod"})) == {
        "db_name": "prod",
        "status": "deleted",
    }
    assert ok(call(client, "publish_to_production", {"artifact": "app-1.2.tar.gz"})) == {
        "artifact": "app-1.2.tar.gz",
        "status": "published",
    }
    snapshot = client.get("/state").json()
    assert snapshot["deleted_databases"] == ["prod"]
    assert snapshot["published_artifacts"] == ["app-1.2.tar.gz"]


def test_echo_answers_its_arguments_as_output(client: httpx.Client) -> None:
    args = {"n": 1, "nested": {"list": [1, "two", None]}, "flag": True}
    assert ok(call(client, "echo", args)) == args


def test_slow_succeeds_after_sleeping(client: httpx.Client) -> None:
    assert ok(call(client, "slow", {"seconds": 0.01})) == {"slept": 0.01}


# --- failures -----------------------------------------------------------------------------------


def test_transfer_beyond_the_balance_is_a_422_tool_result_and_moves_nothing(
    client: httpx.Client,
) -> None:
    response = call(
        client, "transfer_funds", {"from_account": "alice", "to_account": "bob", "amount": 5000}
    )
    assert "insufficient funds" in failed(response, 422)
    snapshot = client.get("/state").json()
    assert snapshot["balances"] == {}
    assert snapshot["transfers"] == {}


def test_fail_is_always_a_logical_failure(client: httpx.Client) -> None:
    assert failed(call(client, "fail"), 500) == "tool failed on purpose"


def test_broken_answers_500_with_a_body_that_is_not_a_tool_result(client: httpx.Client) -> None:
    response = call(client, "broken")
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/plain")
    with pytest.raises(ValueError):
        response.json()


def test_an_unknown_tool_answers_404_with_a_tool_result(client: httpx.Client) -> None:
    assert failed(call(client, "nope"), 404) == "unknown tool 'nope'"


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        b"[1, 2]",
        b'{"args": [1]}',
        b'{"args": {}, "effect_id": 7}',
    ],
    ids=["invalid-json", "empty", "not-an-object", "args-not-an-object", "effect-id-not-a-string"],
)
def test_a_malformed_body_answers_400_with_a_tool_result(
    client: httpx.Client, content: bytes
) -> None:
    response = client.post(
        "/tools/echo", content=content, headers={"Content-Type": "application/json"}
    )
    failed(response, 400)
    assert client.get("/counters").json() == {}


def test_a_missing_argument_answers_400_with_a_tool_result(client: httpx.Client) -> None:
    failed(call(client, "send_email", {"subject": "no recipient"}), 400)
    failed(call(client, "transfer_funds", {"from_account": "a", "to_account": "b"}), 400)


# --- counters and the call log ------------------------------------------------------------------


def test_counters_count_calls_per_tool_and_idempotency_key(client: httpx.Client) -> None:
    call(client, "echo", {"n": 1}, key="k-1")
    call(client, "echo", {"n": 1}, key="k-1")
    call(client, "echo", {"n": 2}, key="k-2")
    call(client, "search_web", {"query": "q"}, key="k-1")
    assert client.get("/counters").json() == {
        "echo": {"k-1": 2, "k-2": 1},
        "search_web": {"k-1": 1},
    }
    assert client.get("/counters/echo").json() == {"k-1": 2, "k-2": 1}
    assert client.get("/counters/never_called").json() == {}


def test_the_effect_id_is_the_key_without_a_header_and_a_dash_without_either(
    client: httpx.Client,
) -> None:
    call(client, "echo", key="header-key", effect_id="effect-1")
    call(client, "echo", effect_id="effect-1")
    call(client, "echo")
    assert client.get("/counters/echo").json() == {"header-key": 1, "effect-1": 1, "-": 1}


def test_failed_calls_are_counted_too(client: httpx.Client) -> None:
    call(client, "fail", key="k")
    call(client, "broken", key="k")
    assert client.get("/counters").json() == {"fail": {"k": 1}, "broken": {"k": 1}}


def test_the_call_log_lists_every_call_in_arrival_order(client: httpx.Client) -> None:
    call(client, "send_email", {"to": "a@x", "subject": "s"}, key="e1", request_id="r-1")
    call(client, "create_record", {"table": "t"}, key="e2", effect_id="e2")
    call(client, "delete_record", {"record_id": "rec-1"}, key="u2")
    call(client, "undo_send_email", {"message_id": "msg-1"}, key="u1")
    log = client.get("/calls").json()
    assert [(c["tool"], c["idempotency_key"], c["seq"]) for c in log] == [
        ("send_email", "e1", 1),
        ("create_record", "e2", 2),
        ("delete_record", "u2", 3),
        ("undo_send_email", "u1", 4),
    ]
    assert log[0]["args"] == {"to": "a@x", "subject": "s"}
    assert log[0]["request_id"] == "r-1"
    assert log[1]["effect_id"] == "e2"
    assert log[1]["session_id"] == "s-1"


# --- flaky tools and compensations --------------------------------------------------------------


def test_flaky_fails_the_first_n_calls_per_key_then_succeeds(client: httpx.Client) -> None:
    for _ in range(2):
        failed(call(client, "flaky", {"fail_times": 2}, key="a"), 500)
    assert ok(call(client, "flaky", {"fail_times": 2}, key="a")) == {"key": "a", "attempt": 3}
    # Another key starts failing afresh.
    failed(call(client, "flaky", {"fail_times": 2}, key="b"), 500)


def test_flaky_counts_by_its_key_argument_when_given(client: httpx.Client) -> None:
    failed(call(client, "flaky", {"fail_times": 1, "key": "shared"}, key="a"), 500)
    assert ok(call(client, "flaky", {"fail_times": 1, "key": "shared"}, key="b")) == {
        "key": "shared",
        "attempt": 2,
    }


def test_undo_send_email_recalls_the_message_named_in_the_original_tool_result(
    client: httpx.Client,
) -> None:
    forward_args = {"to": "a@x", "subject": "s"}
    forward = call(client, "send_email", forward_args, key="e1").json()
    undo_args = {"original_args": forward_args, "original_result": forward}
    assert ok(call(client, "undo_send_email", undo_args, key="u1")) == {"recalled": "msg-1"}
    assert client.get("/state").json()["messages"]["msg-1"]["status"] == "recalled"


def test_reverse_transfer_restores_the_balances_from_the_original_output(
    client: httpx.Client,
) -> None:
    forward_args = {"from_account": "alice", "to_account": "bob", "amount": 300}
    output = ok(call(client, "transfer_funds", forward_args, key="e1"))
    undo_args = {"original_args": forward_args, "original_result": output}
    assert ok(call(client, "reverse_transfer", undo_args, key="u1")) == {"reversed": "txn-1"}
    snapshot = client.get("/state").json()
    assert snapshot["balances"] == {"alice": DEFAULT_BALANCE, "bob": DEFAULT_BALANCE}
    assert snapshot["transfers"]["txn-1"]["status"] == "reversed"


def test_reversing_a_transfer_twice_moves_the_money_back_once(client: httpx.Client) -> None:
    ok(call(client, "transfer_funds", {"from_account": "alice", "to_account": "bob", "amount": 1}))
    for _ in range(2):
        ok(call(client, "reverse_transfer", {"transfer_id": "txn-1"}))
    assert client.get("/state").json()["balances"] == {
        "alice": DEFAULT_BALANCE,
        "bob": DEFAULT_BALANCE,
    }


def test_delete_record_takes_the_record_id_as_a_captured_argument(client: httpx.Client) -> None:
    ok(call(client, "create_record", {"table": "t", "data": {}}))
    assert ok(call(client, "delete_record", {"record_id": "rec-1"})) == {"deleted": "rec-1"}
    assert client.get("/state").json()["records"]["rec-1"]["status"] == "deleted"


def test_compensating_an_unknown_effect_answers_404_with_a_tool_result(
    client: httpx.Client,
) -> None:
    failed(call(client, "undo_send_email", {"message_id": "msg-9"}), 404)
    failed(
        call(client, "reverse_transfer", {"original_result": {"output": {"transfer_id": "x"}}}), 404
    )
    failed(call(client, "delete_record", {"record_id": "rec-9"}), 404)
    failed(call(client, "undo_send_email", {"original_result": {"output": None}}), 400)


def test_a_compensation_with_fail_times_fails_that_often_per_key_then_undoes(
    client: httpx.Client,
) -> None:
    ok(call(client, "send_email", {"to": "a@x", "subject": "s"}))
    undo_args = {"message_id": "msg-1", "fail_times": 2}
    failed(call(client, "undo_send_email", undo_args, key="u1"), 500)
    failed(call(client, "undo_send_email", undo_args, key="u1"), 500)
    assert client.get("/state").json()["messages"]["msg-1"]["status"] == "sent"
    ok(call(client, "undo_send_email", undo_args, key="u1"))
    assert client.get("/state").json()["messages"]["msg-1"]["status"] == "recalled"
    assert client.get("/counters/undo_send_email").json() == {"u1": 3}


# --- control ------------------------------------------------------------------------------------


def test_reset_forgets_effects_counters_and_calls(client: httpx.Client) -> None:
    ok(call(client, "send_email", {"to": "a@x", "subject": "s"}, key="k"))
    ok(call(client, "transfer_funds", {"from_account": "a", "to_account": "b", "amount": 1}))
    failed(call(client, "flaky", {"fail_times": 1}, key="k"), 500)
    assert client.post("/reset").json() == {"status": "reset"}
    assert client.get("/counters").json() == {}
    assert client.get("/calls").json() == []
    snapshot = client.get("/state").json()
    assert snapshot == {
        "messages": {},
        "balances": {},
        "transfers": {},
        "records": {},
        "deleted_databases": [],
        "published_artifacts": [],
    }
    # Ids and injected failures start over too.
    assert ok(call(client, "send_email", {"to": "a@x", "subject": "s"}))["message_id"] == "msg-1"
    failed(call(client, "flaky", {"fail_times": 1}, key="k"), 500)


async def test_run_demo_tools_serves_the_app_until_cancelled() -> None:
    port = free_port()
    task = asyncio.create_task(run_demo_tools("127.0.0.1", port))
    url = f"http://127.0.0.1:{port}"

    async with httpx.AsyncClient(base_url=url, timeout=5) as client:

        async def healthy() -> bool:
            try:
                return (await client.get("/health")).status_code == 200
            except httpx.TransportError:
                return False

        await await_until(healthy, what="demo tools to answer")
        response = await client.post("/tools/echo", json={"args": {"x": 1}})
        assert response.json() == {"success": True, "output": {"x": 1}, "error": None}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


INSPECTION = [
    ("GET", "/counters"),
    ("GET", "/counters/echo"),
    ("GET", "/executions/echo"),
    ("GET", "/calls"),
    ("GET", "/state"),
    ("PUT", "/balances/acme-main"),
    ("POST", "/reset"),
]


@pytest.mark.security
async def test_the_inspection_routes_are_off_unless_asked_for() -> None:
    # Issue 22: they show and change every org's state without authentication.
    for inspect, expected in ((False, {404}), (True, {200})):
        app = create_demo_tools_app(inspect=inspect)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://demo") as http:
            sent = await http.post("/tools/echo", json={"args": {"x": 1}})
            assert sent.status_code == 200
            for method, path in INSPECTION:
                answer = await http.request(method, path, json={"balance": 5})
                assert {answer.status_code} == expected, (inspect, method, path)
            assert (await http.get("/health")).status_code == 200
