"""Bad input answers 400 with a clear message on both stores: never 500/503, never raw
database or Python text (issue 11). Each case is sent from outside, to a real proxy.

- `Last-Event-ID` / `last_event_id` that is no event id (`²`, negative, beyond 64 bits);
- a NUL in any path id or in a free-text body field (PostgreSQL text cannot hold NUL);
- compensation integers out of range (`max_retries = 2**40`, negative, non-integer), which
  were accepted and then broke every call of the tool ("value out of int32 range");
- an unexpected error sends a fixed message with the request id, never `repr(exc)`.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from undolog.config import load_settings

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
NUL = "%00"
LOCAL = {"tier": "compensable", "compensation": {"fn_name": "undo_local", "max_retries": 1}}
# Words that only raw database or Python error text would carry.
LEAKS = ("asyncpg", "invalid byte sequence", "0x00", "Traceback", "Error(", "out of range")


def assert_clean_400(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["code"] == "invalid_request", body
    assert set(body) >= {"request_id", "code", "message", "timestamp"}
    assert not any(word in body["message"] for word in LEAKS), body["message"]


def call(c: httpx.Client, session: str, tool: str, step: int, **extra: Any) -> httpx.Response:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": {"n": step}}
    return c.post(TOOL_CALL, json={**body, **extra})


# -- /events ------------------------------------------------------------------------------------

BAD_EVENT_IDS = ["²", "-1", "99999999999999999999999", "1e3", " 1", "٣"]


@pytest.mark.parametrize("raw", BAD_EVENT_IDS)
def test_a_query_last_event_id_that_is_no_event_id_is_400(proxy: ProxyHarness, raw: str) -> None:
    with proxy.client() as c:
        assert_clean_400(c.get("/events", params={"last_event_id": raw}))


@pytest.mark.parametrize("raw", [b"\xb2", b"-5", b"18446744073709551616", b"\xd9\xa3"])
def test_a_last_event_id_header_that_is_no_event_id_is_400(proxy: ProxyHarness, raw: bytes) -> None:
    with proxy.client() as c:
        assert_clean_400(c.get("/events", headers=[(b"Last-Event-ID", raw)]))


# -- NUL in path ids and free text --------------------------------------------------------------

NUL_PATHS = [
    ("GET", f"/effects/a{NUL}b"),
    ("POST", f"/effects/a{NUL}b/commit"),
    ("POST", f"/effects/a{NUL}b/fail"),
    ("POST", f"/effects/a{NUL}b/resolve"),
    ("GET", f"/sessions/a{NUL}b"),
    ("POST", f"/sessions/a{NUL}b/rollback"),
    ("POST", f"/sessions/a{NUL}b/complete"),
    ("GET", f"/approvals/a{NUL}b"),
    ("POST", f"/approvals/a{NUL}b/approve"),
    ("POST", f"/approvals/a{NUL}b/reject"),
    ("POST", f"/undo/a{NUL}b/claim"),
    ("POST", f"/undo/a{NUL}b/complete"),
    ("POST", f"/undo/a{NUL}b/fail"),
    ("POST", f"/undo/a{NUL}b/retry"),
    ("POST", f"/undo/a{NUL}b/resolve"),
    ("PUT", f"/tools/a{NUL}b"),
]


@pytest.mark.parametrize(("method", "path"), NUL_PATHS, ids=[p for _, p in NUL_PATHS])
def test_a_nul_in_a_path_id_is_400(proxy: ProxyHarness, method: str, path: str) -> None:
    body = {"tier": "safe", "note": "n", "error": "e", "result": 1, "outcome": "failed"}
    with proxy.client() as c:
        assert_clean_400(c.request(method, path, json=body))


def test_a_nul_in_an_approval_reason_is_recorded_scrubbed_not_a_database_error(
    proxy: ProxyHarness,
) -> None:
    """The approvals engine already replaces NUL in a decision's text (kept as it was)."""
    session = str(uuid.uuid4())
    with proxy.client() as c:
        pending = call(c, session, "delete_database", 1)
        assert pending.status_code == 202, pending.text
        approval = pending.json()["approval_id"]
        rejected = c.post(f"/approvals/{approval}/reject", json={"reason": "a\x00b"})
        assert rejected.status_code == 200, rejected.text
        assert c.get(f"/approvals/{approval}").json()["reason"] == "a\ufffdb"


def _failed_sdk_entry(c: httpx.Client, session: str) -> str:
    """An SDK entry that gave up (claimed, failed twice): the operator's to resolve."""
    c.put("/tools/local_write", json=LOCAL).raise_for_status()
    effect = call(c, session, "local_write", 1, mode="sdk").json()["effect_id"]
    c.post(f"/effects/{effect}/commit", json={"result": {"row": 1}}).raise_for_status()
    entry = str(c.post(f"/sessions/{session}/rollback").json()["next_entry"]["entry_id"])
    token = c.post(f"/undo/{entry}/claim").json()["claim_token"]
    c.post(f"/undo/{entry}/fail", json={"error": "x", "claim_token": token}).raise_for_status()
    gave_up = c.post(f"/undo/{entry}/fail", json={"error": "y", "claim_token": token})
    assert gave_up.status_code == 502, gave_up.text
    return entry


def test_a_nul_in_an_undo_resolve_note_is_400_and_the_entry_stays_failed(
    proxy: ProxyHarness,
) -> None:
    session = str(uuid.uuid4())
    with proxy.client() as c:
        entry = _failed_sdk_entry(c, session)
        assert_clean_400(c.post(f"/undo/{entry}/resolve", json={"note": "by\x00hand"}))
        [row] = c.get(f"/sessions/{session}").json()["undo_stack"]
    assert (row["entry_id"], row["state"]) == (entry, "failed")


def test_a_nul_in_an_effect_resolve_error_is_400(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        c.put("/tools/local_write", json=LOCAL).raise_for_status()
        effect = call(c, str(uuid.uuid4()), "local_write", 1, mode="sdk").json()["effect_id"]
        answer = c.post(f"/effects/{effect}/resolve", json={"outcome": "failed", "error": "\x00"})
    # An executing effect cannot be resolved either way; what matters is no 503.
    assert answer.status_code in (400, 409), answer.text
    assert answer.json()["code"] in ("invalid_request", "invalid_state_transition")


def test_a_runner_reported_error_with_a_nul_is_recorded_not_refused(proxy: ProxyHarness) -> None:
    """A failure report must not be lost over one character: NUL is replaced, as before."""
    session = str(uuid.uuid4())
    with proxy.client() as c:
        c.put("/tools/local_write", json=LOCAL).raise_for_status()
        effect = call(c, session, "local_write", 1, mode="sdk").json()["effect_id"]
        c.post(f"/effects/{effect}/commit", json={"result": {"row": 1}}).raise_for_status()
        entry = c.post(f"/sessions/{session}/rollback").json()["next_entry"]["entry_id"]
        token = c.post(f"/undo/{entry}/claim").json()["claim_token"]
        once = c.post(f"/undo/{entry}/fail", json={"error": "disk\x00busy", "claim_token": token})
    assert once.status_code == 200, once.text
    assert once.json()["last_error"] == "disk\ufffdbusy"


def test_a_nul_in_a_tool_version_or_compensation_name_is_400(proxy: ProxyHarness) -> None:
    undo = {"fn_name": "undo\x00it", "max_retries": 1, "retry_backoff_ms": 1}
    with proxy.client() as c:
        assert_clean_400(c.put("/tools/t1", json={"tier": "safe", "version": "1\x00"}))
        assert_clean_400(c.put("/tools/t2", json={"tier": "compensable", "compensation": undo}))
        undo = {"fn_name": "undo_it", "fn_version": "\x00", "max_retries": 1}
        assert_clean_400(c.put("/tools/t3", json={"tier": "compensable", "compensation": undo}))
        assert {t["name"] for t in c.get("/tools").json()}.isdisjoint({"t1", "t2", "t3"})


def test_a_nul_in_a_tool_call_session_id_is_400(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        assert_clean_400(call(c, "a\x00b", "search_web", 1))


# -- integer ranges of a compensation -----------------------------------------------------------

BAD_INTEGERS = {
    "max_retries 2**40": {"max_retries": 2**40},
    "max_retries 2**31": {"max_retries": 2**31},
    "max_retries negative": {"max_retries": -1},
    "max_retries a float": {"max_retries": 1.5},
    "max_retries a string": {"max_retries": "3"},
    "max_retries true": {"max_retries": True},
    "retry_backoff_ms 2**40": {"retry_backoff_ms": 2**40},
    "retry_backoff_ms negative": {"retry_backoff_ms": -5},
}


@pytest.mark.parametrize("case", list(BAD_INTEGERS))
def test_a_compensation_integer_out_of_range_is_refused_at_registration(
    proxy: ProxyHarness, case: str
) -> None:
    undo = {"fn_name": "echo", **BAD_INTEGERS[case]}
    with proxy.client() as c:
        refused = c.put("/tools/echo", json={"tier": "compensable", "compensation": undo})
        assert_clean_400(refused)
        # The tool as registered before still works: nothing half-registered.
        ran = call(c, str(uuid.uuid4()), "echo", 1)
    assert ran.status_code == 200, ran.text
    assert ran.json()["status"] == "executed"


@pytest.mark.parametrize("case", list(BAD_INTEGERS))
def test_a_config_compensation_integer_out_of_range_is_refused_at_load(
    tmp_path: Path, case: str
) -> None:
    [(name, value)] = BAD_INTEGERS[case].items()
    literal = {True: "true"}.get(value, repr(value)) if not isinstance(value, str) else '"3"'
    config = tmp_path / "undolog.toml"
    config.write_text(
        '[[tools]]\norg = "o"\nname = "echo"\ntier = "compensable"\n'
        f'compensation = {{ fn_name = "echo", {name} = {literal} }}\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=name):
        load_settings({"config": str(config)}, env={})


# -- unexpected errors ----------------------------------------------------------------------------


def test_a_route_that_raises_an_undolog_error_answers_its_error_body(
    proxy: ProxyHarness,
) -> None:
    """Routes raise; the app's one handler answers with the code, fields and Retry-After."""
    from undolog_sdk.errors import InProgress

    app = proxy.server.app.fastapi  # type: ignore[union-attr]

    async def busy() -> None:
        raise InProgress("effect-1", 7)

    app.add_api_route("/test-only/busy", busy, methods=["GET"])
    with proxy.client() as c:
        answer = c.get("/test-only/busy")
    assert answer.status_code == 409
    assert answer.headers["Retry-After"] == "7"
    body = answer.json()
    assert (body["code"], body["effect_id"], body["retry_after"]) == ("in_progress", "effect-1", 7)
    assert body["request_id"] == answer.headers["X-Request-Id"]


def test_an_unexpected_error_sends_a_fixed_message_not_the_python_repr(
    proxy: ProxyHarness,
) -> None:
    """A route that hits a bug (here: a store whose read raises a plain Python error)."""
    app = proxy.server.app.fastapi  # type: ignore[union-attr]

    async def boom() -> None:
        raise RuntimeError("secret internals at 0xdeadbeef")

    app.add_api_route("/test-only/boom", boom, methods=["GET"])
    fast = proxy.server.app.fast_routes  # type: ignore[union-attr]
    route, handler = fast[("POST", TOOL_CALL)]

    async def broken(request: Any) -> Any:
        raise RuntimeError("secret internals at 0xdeadbeef")

    fast[("POST", TOOL_CALL)] = (route, broken)
    try:
        # One client each: the server closes the connection of a request that hit a bug.
        with proxy.client() as c:
            answers = [c.get("/test-only/boom")]
        with proxy.client() as c:
            answers.append(call(c, str(uuid.uuid4()), "search_web", 1))
    finally:
        fast[("POST", TOOL_CALL)] = (route, handler)
    for answer in answers:
        assert answer.status_code == 500
        body = answer.json()
        assert body["code"] == "internal_error"
        assert "secret" not in body["message"] and "RuntimeError" not in body["message"]
        assert body["request_id"] == answer.headers["X-Request-Id"]
        assert body["request_id"] in body["message"]
