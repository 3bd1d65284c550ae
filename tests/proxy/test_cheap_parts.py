"""The per-request shortcuts of the proxy's HTTP path say what the long way said.

Cached metric children, request ids built without `uuid.UUID`, the one-shot HMAC of the
upstream signature, a principal's actor built once, the body the edge read handed to a fast route.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import uuid

import pytest
from blake3 import blake3
from starlette.requests import Request
from starlette.responses import Response

from undolog.engine.keys import Role
from undolog.engine.model import Actor, new_id
from undolog.proxy.edge import Edge, KeyResolver
from undolog.proxy.roles import Principal
from undolog.services.metrics import ProxyMetrics
from undolog.store.records import KeyRecord
from undolog_sdk.upstream import sign_request, verify_request


def _sample(metrics: ProxyMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_a_cached_child_is_the_librarys_own_child() -> None:
    metrics = ProxyMetrics.create()
    first = metrics.http_requests.labels("/mcp/tool_call", "200")
    assert metrics.http_requests.labels("/mcp/tool_call", "200") is first
    assert metrics.http_requests.labels(route="/mcp/tool_call", status="200") is first
    first.inc()
    metrics.http_requests.labels("/mcp/tool_call", "200").inc()
    labels = {"route": "/mcp/tool_call", "status": "200"}
    assert _sample(metrics, "undolog_proxy_http_requests_total", labels) == 2.0
    metrics.http_duration.labels("/mcp/tool_call").observe(0.003)
    metrics.http_duration.labels("/mcp/tool_call").observe(0.004)
    count = "undolog_proxy_http_request_duration_seconds_count"
    assert _sample(metrics, count, {"route": "/mcp/tool_call"}) == 2.0


def test_removed_and_cleared_children_are_not_served_from_the_cache() -> None:
    metrics = ProxyMetrics.create()
    family = metrics.effects_in_doubt
    family.labels("outcome_unknown").inc()
    family.remove("outcome_unknown")
    family.labels("outcome_unknown").inc()  # a new child, exported
    name = "undolog_proxy_effects_in_doubt_total"
    assert _sample(metrics, name, {"reason": "outcome_unknown"}) == 1.0
    family.clear()
    assert _sample(metrics, name, {"reason": "outcome_unknown"}) is None
    family.labels("outcome_unknown").inc()
    assert _sample(metrics, name, {"reason": "outcome_unknown"}) == 1.0
    family.labels("lease_expired").inc()
    family.remove_by_labels({"reason": "lease_expired"})
    family.labels("lease_expired").inc()
    assert _sample(metrics, name, {"reason": "lease_expired"}) == 1.0


def test_values_that_are_not_plain_strings_are_labelled_as_the_library_labels_them() -> None:
    metrics = ProxyMetrics.create()
    family = metrics.http_requests
    family.labels("/x", 1).inc()
    family.labels("/x", True).inc()  # equal to 1 as a key, but the label is "True"
    assert _sample(metrics, "undolog_proxy_http_requests_total", {"route": "/x", "status": "1"})
    assert _sample(metrics, "undolog_proxy_http_requests_total", {"route": "/x", "status": "True"})
    with pytest.raises(ValueError, match="Incorrect label count"):
        family.labels("/x")


def test_request_ids_are_version_4_uuids_in_their_usual_text() -> None:
    seen = set()
    for _ in range(2000):
        text = new_id()  # a request id, as the edge makes it
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
        seen.add(text)
    assert len(seen) == 2000


def test_the_upstream_signature_is_the_hmac_sha256_of_the_v2_message() -> None:
    secret, org, effect, stamp = "s3cret", "org_a", "0d1f7e8a-1111-4222-8333-444455556666", 17
    body = b'{"args":{}}'
    digest = blake3(body).hexdigest()
    message = f"v2\nPOST\n/tools/echo\necho\n{digest}\n{org}\n{effect}\n{stamp}"
    expected = hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()
    signature = sign_request(
        secret, org_id=org, method="POST", path="/tools/echo", tool="echo", body=body,
        effect_id=effect, timestamp=stamp,
    )  # fmt: skip
    assert signature == f"v2={expected}"
    headers = {
        "X-UndoLog-Org": org,
        "X-UndoLog-Tool": "echo",
        "X-UndoLog-Effect-Id": effect,
        "X-UndoLog-Timestamp": str(stamp),
        "X-UndoLog-Signature": f"v2={expected}",
    }
    assert verify_request(secret, headers, "POST", "/tools/echo", body, now=17).org_id == org


def test_a_principals_actor_is_built_once_and_follows_its_role() -> None:
    agent = Principal("org_a", "key_1", "bot", Role.AGENT)
    assert agent.actor is agent.actor
    assert agent.actor == Actor("key_1", own_sessions_only=True, key_name="bot")
    admin = dataclasses.replace(agent, role=Role.ADMIN)
    assert admin.actor == Actor("key_1", own_sessions_only=False, key_name="bot")
    assert agent == Principal("org_a", "key_1", "bot", Role.AGENT)
    assert hash(agent) == hash(Principal("org_a", "key_1", "bot", Role.AGENT))
    assert "_actor" not in repr(agent)


async def test_a_fast_route_gets_the_body_the_edge_read_and_receive_goes_on_past_it() -> None:
    record = KeyRecord("key_1", "h", "org_a", "bot", "agent", "cli", 0, None, None)
    seen: dict[str, object] = {}

    async def lookup(key_hash: str) -> KeyRecord | None:
        return record

    async def handler(request: Request) -> Response:
        seen["body"] = await request.body()
        seen["next"] = await request.receive()  # past the body: the server's own messages
        seen["org"] = request.state.org_id
        return Response(b"{}", media_type="application/json")

    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover
        raise AssertionError("the fast route answers, not the app")

    edge = Edge(
        app, metrics=ProxyMetrics.create(), keys=KeyResolver(lookup), max_body_bytes=1 << 20
    )
    route = type("Route", (), {"path": "?"})()
    edge.fast_routes[("POST", "/mcp/tool_call")] = (route, handler)
    incoming = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.request", "body": b"1}", "more_body": False},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return incoming.pop(0)

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp/tool_call",
        "headers": [(b"x-api-key", b"ulk_test"), (b"content-length", b"7")],
    }
    await edge(scope, receive, send)
    assert seen == {"body": b'{"a":1}', "next": {"type": "http.disconnect"}, "org": "org_a"}
    assert sent[0]["status"] == 200
    headers = sent[0]["headers"]
    assert isinstance(headers, list)
    assert headers[-1][0] == b"x-request-id" and len(headers[-1][1]) == 36
    labels = {"route": "?", "status": "200"}
    assert edge.metrics.registry.get_sample_value("undolog_proxy_http_requests_total", labels)
