"""The proxy's edge, through a real server on both stores: input validation, auth, methods,
the body limit, request ids, /health, /metrics and isolation between orgs."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.proxy.conftest import METRICS_AUTH, ProxyHarness

TOOL_CALL = "/mcp/tool_call"
SESSION = "7f9c2a4e-1b7d-4c8e-9a51-0d3f6b2e8c10"


def body(**fields: Any) -> bytes:
    """A tool-call body with sensible defaults; a field set to `...` is left out."""
    data: dict[str, Any] = {"session_id": SESSION, "tool_name": "echo", "args": {"n": 1}}
    data.update(fields)
    return orjson.dumps({k: v for k, v in data.items() if v is not ...})


def raw_args(args_json: str, step: int = 1) -> bytes:
    """A body whose args are written by hand (numbers no JSON library would emit)."""
    return (
        f'{{"session_id": "{SESSION}", "tool_name": "echo", "step_index": {step}, '
        f'"args": {args_json}}}'
    ).encode()


def post_raw(c: httpx.Client, content: bytes, **headers: str) -> httpx.Response:
    return c.post(
        TOOL_CALL, content=content, headers={"Content-Type": "application/json", **headers}
    )


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The reference's error body, tied to the response's X-Request-Id."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()
    assert set(error) >= {"request_id", "code", "message", "timestamp"}
    assert error["code"] == code
    assert error["request_id"] == response.headers["X-Request-Id"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", error["timestamp"])
    return error


def recorded_sessions(proxy: ProxyHarness) -> list[Any]:
    with proxy.client() as c:
        response = c.get("/sessions")
    assert response.status_code == 200
    sessions: list[Any] = response.json()
    return sessions


def ok_call(c: httpx.Client, **headers: str) -> httpx.Response:
    return post_raw(c, body(session_id=str(uuid.uuid4()), step_index=1), **headers)


# --- 400 invalid_request -----------------------------------------------------------------

INVALID_BODIES = {
    "invalid JSON": b'{"session_id": ',
    "empty body": b"",
    "a JSON array": b"[1, 2]",
    "a JSON string": b'"hello"',
    "missing session_id": body(session_id=...),
    "missing tool_name": body(tool_name=...),
    "missing args": body(args=...),
    "an empty tool_name": body(tool_name=""),
    "a session_id that is a number": body(session_id=42),
    "args that are a list": body(args=[1, 2]),
    "args that are null": body(args=None),
    "a session_id that is no UUID": body(session_id="session-1"),
    "a negative step_index": body(step_index=-1),
    "a step_index over 32 bits": body(step_index=2**32),
    "a boolean step_index": body(step_index=True),
    "a fractional step_index": body(step_index=1.5),
    "a string step_index": body(step_index="1"),
    "a tool_version that is no string": body(tool_version=2),
    "a NUL in tool_name": body(tool_name="ec\x00ho"),
    "a NUL in tool_version": body(tool_version="1\x00"),
    "an unknown mode": body(mode="magic"),
    "an integer over 64 bits in args": raw_args('{"n": 18446744073709551616}'),
    "an integer below -2^63 in args": raw_args('{"n": -9223372036854775809}'),
    "a nested huge integer in args": raw_args('{"a": [{"b": 123456789012345678901234567890}]}'),
    "a float overflowing to infinity in args": raw_args('{"n": 1e400}'),
    "NaN in args": raw_args('{"n": NaN}'),
    "a lone surrogate in args": raw_args('{"s": "\\ud800"}'),
    "args nested too deeply": raw_args('{"a": ' + "[" * 1000 + "1" + "]" * 1000 + "}"),
    "args nested too deeply, with a long number": raw_args(
        '{"a": ' + "[" * 1000 + "12345678901234567890123" + "]" * 1000 + "}"
    ),
}


def test_a_malformed_tool_call_is_400_invalid_request_and_records_nothing(
    proxy: ProxyHarness, subtests: pytest.Subtests
) -> None:
    # One proxy for all cases (a fresh org each, so "nothing recorded" is checked per case).
    with proxy.client() as c:
        for case, content in INVALID_BODIES.items():
            with subtests.test(case):
                assert_error(post_raw(c, content), 400, "invalid_request")
                assert recorded_sessions(proxy) == []
    assert proxy.counters("echo") == {}


def test_an_unknown_mode_header_is_400_and_records_nothing(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = post_raw(c, body(step_index=1), **{"X-UndoLog-Mode": "magic"})
    assert_error(response, 400, "invalid_request")
    assert recorded_sessions(proxy) == []


def test_numbers_at_the_edges_of_the_canonical_range_are_accepted(proxy: ProxyHarness) -> None:
    numbers = ["18446744073709551615", "-9223372036854775808", "0.1234567890123456789"]
    with proxy.client() as c:
        for step, number in enumerate(numbers, start=1):
            # A long digit run inside a string is no number: it must not be refused either.
            args = f'{{"n": {number}, "id": "12345678901234567890123"}}'
            response = post_raw(c, raw_args(args, step))
            assert response.status_code == 200, response.text
            assert response.json()["result"]["output"] == orjson.loads(args)


# --- auth --------------------------------------------------------------------------------


def test_a_call_without_an_api_key_is_401(proxy: ProxyHarness) -> None:
    with httpx.Client(base_url=proxy.url) as c:
        response = post_raw(c, body(step_index=1))
    assert_error(response, 401, "auth_failed")
    assert recorded_sessions(proxy) == []


def test_a_call_with_an_unknown_api_key_is_403(proxy: ProxyHarness) -> None:
    with proxy.client(api_key="ul_test_not-a-real-key") as c:
        response = post_raw(c, body(step_index=1))
    error = assert_error(response, 403, "auth_failed")
    assert "ul_test_not-a-real-key" not in response.text
    assert error["message"]


@pytest.mark.parametrize("header", ["X-Org-Id", "X-UndoLog-Org-Id"])
def test_a_client_org_id_that_disagrees_with_the_key_is_403(
    proxy: ProxyHarness, header: str
) -> None:
    with proxy.client() as c:
        response = ok_call(c, **{header: "org-someone-else"})
    assert_error(response, 403, "auth_failed")
    assert recorded_sessions(proxy) == []


@pytest.mark.parametrize("header", ["X-Org-Id", "X-UndoLog-Org-Id"])
def test_a_client_org_id_that_agrees_with_the_key_is_accepted(
    proxy: ProxyHarness, header: str
) -> None:
    with proxy.client() as c:
        response = ok_call(c, **{header: proxy.org_id})
    assert response.status_code == 200, response.text


def test_another_orgs_session_is_not_found(proxy: ProxyHarness, proxy_factory: Any) -> None:
    other: ProxyHarness = proxy_factory()
    session = str(uuid.uuid4())
    with proxy.client() as c:
        assert post_raw(c, body(session_id=session, step_index=1)).status_code == 200
        assert c.get(f"/sessions/{session}").status_code == 200
    with other.client() as c:
        assert_error(c.get(f"/sessions/{session}"), 404, "not_found")
        assert session not in [s["session_id"] for s in c.get("/sessions").json()]


def test_another_orgs_effect_can_be_neither_read_nor_committed(
    proxy: ProxyHarness, proxy_factory: Any
) -> None:
    other: ProxyHarness = proxy_factory()
    with proxy.client() as c:
        response = post_raw(c, body(session_id=str(uuid.uuid4()), step_index=1, mode="sdk"))
        effect_id = response.json()["effect_id"]
    with other.client() as c:
        assert_error(c.get(f"/effects/{effect_id}"), 404, "not_found")
        commit = c.post(f"/effects/{effect_id}/commit", json={"result": {"success": True}})
        assert_error(commit, 404, "not_found")
        fail = c.post(f"/effects/{effect_id}/fail", json={"error": "x"})
        assert_error(fail, 404, "not_found")
    with proxy.client() as c:
        assert c.get(f"/effects/{effect_id}").json()["state"] == "executing"


def test_the_same_call_in_two_orgs_is_two_effects(proxy: ProxyHarness, proxy_factory: Any) -> None:
    other: ProxyHarness = proxy_factory()
    content = body(session_id=str(uuid.uuid4()), step_index=1)
    with proxy.client() as c:
        mine = post_raw(c, content).json()
    with other.client() as c:
        theirs = post_raw(c, content).json()
    assert mine["status"] == theirs["status"] == "executed"
    assert mine["effect_id"] != theirs["effect_id"]


# --- methods and the body limit ----------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_the_tool_call_route_are_405(proxy: ProxyHarness, method: str) -> None:
    with proxy.client() as c:
        response = c.request(method, TOOL_CALL)
    assert_error(response, 405, "method_not_allowed")


def test_an_unknown_route_is_404_not_found(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        assert_error(c.get("/no/such/route"), 404, "not_found")


@pytest.fixture
def small_proxy(proxy_factory: Any) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory(max_body_bytes=1024)
    return harness


def oversized() -> bytes:
    return body(step_index=1, args={"blob": "x" * 2000})


def test_a_body_over_the_limit_is_413(small_proxy: ProxyHarness) -> None:
    with small_proxy.client() as c:
        response = post_raw(c, oversized())
    assert_error(response, 413, "payload_too_large")
    assert recorded_sessions(small_proxy) == []


def test_a_chunked_body_over_the_limit_is_413(small_proxy: ProxyHarness) -> None:
    content = oversized()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(content), 256):
            yield content[start : start + 256]

    with small_proxy.client() as c:
        response = c.post(TOOL_CALL, content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert_error(response, 413, "payload_too_large")
    assert recorded_sessions(small_proxy) == []


def test_a_body_just_under_the_limit_is_accepted(small_proxy: ProxyHarness) -> None:
    base = body(step_index=1, args={"blob": ""})
    content = body(step_index=1, args={"blob": "x" * (1024 - len(base))})
    assert len(content) == 1024
    with small_proxy.client() as c:
        response = post_raw(c, content)
    assert response.status_code == 200, response.text


# --- request ids -------------------------------------------------------------------------


def test_every_response_carries_exactly_one_request_id(proxy: ProxyHarness) -> None:
    with httpx.Client(base_url=proxy.url) as anonymous, proxy.client() as c:
        responses = [
            anonymous.get("/health"),
            anonymous.get("/metrics"),
            anonymous.post(TOOL_CALL, content=body()),  # 401
            c.get("/tools"),
            ok_call(c),
            post_raw(c, b"{"),  # 400
            c.get(TOOL_CALL),  # 405
            c.get("/sessions/" + str(uuid.uuid4())),  # 404
        ]
        with proxy.client(api_key="ul_unknown") as stranger:
            responses.append(stranger.get("/tools"))  # 403
    for response in responses:
        ids = response.headers.get_list("X-Request-Id")
        assert len(ids) == 1, (response.request.url, ids)
        uuid.UUID(ids[0])
        if response.status_code >= 400:
            assert response.json()["request_id"] == ids[0]
    assert len({r.headers["X-Request-Id"] for r in responses}) == len(responses)


@pytest.mark.parametrize("path", ["/health", "/tools", TOOL_CALL])
def test_a_client_request_id_is_echoed(proxy: ProxyHarness, path: str) -> None:
    with proxy.client() as c:
        response = c.get(path, headers={"X-Request-Id": "req-abc.123"})
    assert response.headers.get_list("X-Request-Id") == ["req-abc.123"]
    if response.status_code >= 400:
        assert response.json()["request_id"] == "req-abc.123"


def test_an_unsafe_client_request_id_is_replaced(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        response = c.get("/tools", headers={"X-Request-Id": "bad id\twith spaces"})
    uuid.UUID(response.headers["X-Request-Id"])


# --- /health and /metrics ----------------------------------------------------------------


def test_health_needs_no_key_and_answers_exactly_the_reference_body(
    proxy: ProxyHarness,
) -> None:
    with httpx.Client(base_url=proxy.url) as c:
        response = c.get("/health")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert response.json() == {"status": "ok", "service": "undolog-proxy"}


def scrape(proxy: ProxyHarness) -> str:
    with httpx.Client(base_url=proxy.url, headers=METRICS_AUTH) as c:
        response = c.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def test_metrics_need_the_metrics_token_not_a_key_and_count_tool_calls_and_the_executor(
    proxy: ProxyHarness,
) -> None:
    with proxy.client() as c:
        assert ok_call(c).status_code == 200
        assert post_raw(c, b"{").status_code == 400
    text = scrape(proxy)
    assert 'undolog_proxy_http_requests_total{route="/mcp/tool_call",status="200"} 1.0' in text
    assert 'undolog_proxy_http_requests_total{route="/mcp/tool_call",status="400"} 1.0' in text
    assert 'undolog_proxy_http_request_duration_seconds_count{route="/mcp/tool_call"}' in text
    assert 'undolog_proxy_engine_rpc_duration_seconds_count{method="intercept"}' in text
    assert 'undolog_proxy_engine_rpc_duration_seconds_count{method="commit"} 1.0' in text
    assert 'undolog_proxy_executor_duration_seconds_count{result="success"} 1.0' in text
    for family in (
        "undolog_proxy_engine_rpc_errors_total",
        "undolog_proxy_engine_rpc_retries_total",
        "undolog_proxy_sse_subscribers",
        "undolog_proxy_sse_events_dropped_total",
        "undolog_proxy_approval_decisions_total",
        "undolog_proxy_approval_decision_duration_seconds",
    ):
        assert f"# TYPE {family}" in text


def test_metrics_do_not_count_health_or_metrics(proxy: ProxyHarness) -> None:
    with httpx.Client(base_url=proxy.url, headers=METRICS_AUTH) as c:
        for _ in range(3):
            c.get("/health")
            c.get("/metrics")
    text = scrape(proxy)
    assert 'route="/health"' not in text
    assert 'route="/metrics"' not in text


def test_the_api_key_never_appears_in_metrics_or_error_bodies(proxy: ProxyHarness) -> None:
    with proxy.client() as c:
        errors = [
            post_raw(c, b"{"),
            c.get(TOOL_CALL),
            c.get("/sessions/" + str(uuid.uuid4())),
            post_raw(c, body(tool_name="nope", step_index=1)),
            ok_call(c, **{"X-Org-Id": "org-other"}),
        ]
    with httpx.Client(base_url=proxy.url) as anonymous:
        errors.append(anonymous.get("/tools"))
    assert all(r.status_code >= 400 for r in errors)
    for text in [scrape(proxy), *(r.text for r in errors)]:
        assert proxy.api_key not in text
