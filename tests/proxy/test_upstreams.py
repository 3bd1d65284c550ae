"""No tenant-controlled network targets, and a signed org header on every upstream call.

A real proxy on a loopback port, real stores, real upstreams: a "victim" server records every
request it gets, so a refused registration is proved to have sent nothing; a leaky server
answers with a secret body that must never reach the caller; the demo tool server, given the
upstream secret, verifies every call the proxy makes (forward calls and compensations).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.proxy.conftest import ProxyHarness, make_settings, role_keys
from tests.support.servers import ThreadServer, free_port, wait_until
from undolog.config import OrgConfig, UpstreamConfig
from undolog.demo.catalog import DEMO_TOOLS
from undolog.demo.tools import create_demo_tools_app
from undolog.upstreams import (
    ORG_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
)
from undolog_sdk.errors import InvalidUpstreamSignature
from undolog_sdk.upstream import signed_headers, verify_request

pytestmark = pytest.mark.security

TOOL_CALL = "/mcp/tool_call"
EMAIL = {"to": "ada@example.com", "subject": "hello"}
LEAK = "SECRET-INTERNAL-DATA-7f3a"


def assert_code(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    assert set(body) >= {"request_id", "code", "message", "timestamp"}
    return body


def call(c: httpx.Client, tool: str, args: dict[str, Any], session: str | None = None) -> Any:
    body = {"session_id": session or str(uuid.uuid4()), "tool_name": tool, "args": args}
    return c.post(TOOL_CALL, json=body)


# --- servers -------------------------------------------------------------------------------


@dataclass
class Recorder:
    """An HTTP server that records every request (method, raw path, headers, body) and answers
    a ToolResult; `body` replaces the answer (for a server that leaks)."""

    status: int = 200
    body: bytes | None = None
    set_cookie: str | None = None  # a Set-Cookie header on every answer
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, request: Request) -> Response:
        self.requests.append(
            {
                "method": request.method,
                "path": request.scope.get("raw_path", b"").decode(),
                "query": request.url.query,
                "headers": dict(request.headers),
                "body": await request.body(),
            }
        )
        if self.body is not None:
            return Response(self.body, status_code=self.status, media_type="text/plain")
        answer = {"success": True, "output": {"ok": True}, "error": None}
        headers = {"Set-Cookie": self.set_cookie} if self.set_cookie else None
        return Response(orjson.dumps(answer), status_code=self.status, headers=headers)

    def app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "DELETE"]
        return Starlette(
            routes=[
                Route("/", self.handle, methods=methods),
                Route("/{path:path}", self.handle, methods=methods),
            ]
        )


@pytest.fixture
def victim() -> Iterator[tuple[Recorder, ThreadServer]]:
    """An internal service nobody should be able to make the proxy call."""
    recorder = Recorder()
    server = ThreadServer(recorder.app()).start()
    try:
        yield recorder, server
    finally:
        server.stop()


class Hangup:
    """A TCP server that accepts a connection, reads a little and closes it: "disconnected"."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.recv(65536)

    def close(self) -> None:
        self.sock.close()


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


@dataclass
class TwoOrgProxy:
    url: str
    keys: dict[str, str]

    def client(self, org: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-Api-Key": self.keys[org]}, timeout=30)


@dataclass
class TwoOrgs:
    """Orgs "a" and "b" (ids in `ids`) and a way to start a proxy serving both."""

    store_url: str
    ids: dict[str, str]
    keys: dict[str, str]
    started: list[ThreadServer] = field(default_factory=list)

    def start(self, upstream_url: str, **overrides: Any) -> TwoOrgProxy:
        from undolog.proxy import create_app

        # Admin keys: registering a tool (`PUT /tools`) is an admin's right.
        orgs = tuple(OrgConfig(org_id=self.ids[o], keys=role_keys(self.keys[o])) for o in self.ids)
        settings = make_settings(self.store_url, upstream_url, orgs, **overrides)
        server = ThreadServer(create_app(settings), settings=settings).start()
        self.started.append(server)
        return TwoOrgProxy(server.url, self.keys)


@pytest.fixture
def two_orgs(store_url: str) -> Iterator[TwoOrgs]:
    suffix = secrets.token_hex(4)
    orgs = TwoOrgs(
        store_url,
        ids={"a": f"org-a-{suffix}", "b": f"org-b-{suffix}"},
        keys={o: "ul_test_" + secrets.token_urlsafe(18) for o in ("a", "b")},
    )
    try:
        yield orgs
    finally:
        for server in orgs.started:
            server.stop()


# --- SSRF: a tenant cannot supply or smuggle a network target ---------------------------------


def ssrf_bodies(port: int) -> dict[str, dict[str, Any]]:
    """Every way the issue found to aim the proxy at an internal address, as PUT bodies."""
    base = {"tier": "safe"}
    urls = {
        "query defeats the forced path": f"http://127.0.0.1:{port}/anything?",
        "fragment defeats the forced path": f"http://127.0.0.1:{port}/anything#",
        "decimal IP": f"http://2130706433:{port}/",
        "hex IP": f"http://0x7f000001:{port}/",
        "user and password": f"http://user:pw@127.0.0.1:{port}/",
        "plain internal URL": f"http://127.0.0.1:{port}",
    }
    bodies = {f"upstream_url: {case}": {**base, "upstream_url": url} for case, url in urls.items()}
    bodies.update(
        {f"upstream as URL: {case}": {**base, "upstream": url} for case, url in urls.items()}
    )
    bodies["upstream not configured"] = {**base, "upstream": "internal"}
    return bodies


def test_every_ssrf_variant_is_refused_at_registration_and_nothing_is_sent(
    proxy: ProxyHarness, victim: tuple[Recorder, ThreadServer], subtests: pytest.Subtests
) -> None:
    recorder, server = victim
    with proxy.client() as c:
        for case, body in ssrf_bodies(server.port).items():
            with subtests.test(case):
                error = assert_code(c.put("/tools/wipe", json=body), 400, "invalid_request")
                assert str(server.port) not in error["message"]
                assert_code(call(c, "wipe", {}), 404, "tool_not_registered")
        with subtests.test("upstream_url says how to name an upstream instead"):
            error = assert_code(
                c.put("/tools/wipe", json={"tier": "safe", "upstream_url": server.url}),
                400,
                "invalid_request",
            )
            assert error["message"].startswith("upstream_url is no longer accepted")
    assert recorder.requests == []


BAD_TOOL_NAMES = {
    "a query": "metrics%3F",
    "a fragment": "x%23y",
    "a path segment": "..%2Fmetrics",
    "a slash": "a%2Fb",
    "only dots": "..",
    "a space": "a%20b",
    "a percent": "a%25b",
    "non-ASCII": "caf%C3%A9",
    "too long": "t" * 129,
}


def test_tool_names_outside_the_safe_charset_are_refused(
    proxy: ProxyHarness, victim: tuple[Recorder, ThreadServer], subtests: pytest.Subtests
) -> None:
    recorder, _ = victim
    with proxy.client() as c:
        for case, raw in BAD_TOOL_NAMES.items():
            with subtests.test(case):
                response = c.put(f"/tools/{raw}", json={"tier": "safe"})
                # ".." is resolved by the client's URL handling into another route entirely.
                if response.status_code != 404:
                    error = assert_code(response, 400, "invalid_request")
                    assert "tool name" in error["message"]
        names = {t["name"] for t in c.get("/tools").json()}
    assert names == set(DEMO_TOOLS)
    assert recorder.requests == []


def test_a_gateway_style_tool_name_is_called_percent_encoded_on_its_upstream(
    proxy_factory: Any, victim: tuple[Recorder, ThreadServer]
) -> None:
    recorder, server = victim
    proxy: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("tools", server.url + "/base/"),))
    with proxy.client() as c:
        c.put("/tools/git.git_create_branch:v-1_x", json={"tier": "safe", "upstream": "tools"})
        response = call(c, "git.git_create_branch:v-1_x", {"branch": "b"})
    assert response.status_code == 200, response.text
    [request] = recorder.requests
    assert request["method"] == "POST"
    assert request["path"] == "/base/tools/git.git_create_branch%3Av-1_x"
    assert request["query"] == ""


def test_a_configured_upstream_restricted_to_one_org_cannot_be_picked_by_another(
    two_orgs: TwoOrgs, victim: tuple[Recorder, ThreadServer], demo_upstream: ThreadServer
) -> None:
    recorder, server = victim
    only_a = UpstreamConfig("a-only", server.url, orgs=(two_orgs.ids["a"],))
    proxy = two_orgs.start(demo_upstream.url, upstreams=(only_a,))
    with proxy.client("a") as a, proxy.client("b") as b:
        assert a.put("/tools/ping", json={"tier": "safe", "upstream": "a-only"}).status_code == 200
        error = assert_code(
            b.put("/tools/ping", json={"tier": "safe", "upstream": "a-only"}),
            400,
            "invalid_request",
        )
        assert "a-only" not in error["message"]  # b is not even told it exists
        assert_code(call(b, "ping", {}), 404, "tool_not_registered")
        assert recorder.requests == []
        assert call(a, "ping", {}).status_code == 200
    [request] = recorder.requests
    assert request["headers"][ORG_HEADER.lower()] == two_orgs.ids["a"]


# --- errors never echo the upstream ----------------------------------------------------------


def test_a_broken_upstream_body_is_never_echoed(proxy_factory: Any, store_url: str) -> None:
    leaky = Recorder(status=500, body=f"{LEAK} db=postgres://admin:hunter2@10.0.0.5".encode())
    server = ThreadServer(leaky.app()).start()
    try:
        proxy: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("leaky", server.url),))
        with proxy.client() as c:
            c.put("/tools/report", json={"tier": "safe", "upstream": "leaky"}).raise_for_status()
            response = call(c, "report", {})
            session = c.get("/sessions").json()
            effects = [c.get(f"/sessions/{s['session_id']}").json()["effects"] for s in session]
    finally:
        server.stop()
    assert response.status_code >= 400
    assert LEAK not in response.text
    assert "hunter2" not in response.text
    assert LEAK not in orjson.dumps(effects).decode()
    assert len(leaky.requests) == 1


def test_transport_errors_do_not_reveal_port_state(proxy_factory: Any) -> None:
    hangup = Hangup()
    try:
        proxy: ProxyHarness = proxy_factory(
            upstreams=(
                UpstreamConfig("closed", closed_port_url()),
                UpstreamConfig("hangup", f"http://127.0.0.1:{hangup.port}"),
            )
        )
        messages = {}
        with proxy.client() as c:
            for name in ("closed", "hangup"):
                c.put(f"/tools/t-{name}", json={"tier": "safe", "upstream": name})
                response = call(c, f"t-{name}", {})
                assert response.status_code >= 400, response.text
                messages[name] = response.json()["message"]
        assert hangup.accepted >= 1
    finally:
        hangup.close()
    for message in messages.values():
        for leak in ("Connect call failed", "disconnected", "Errno", "127.0.0.1", "refused"):
            assert leak.lower() not in message.lower(), message


# --- the signed org header -------------------------------------------------------------------


def test_every_upstream_call_carries_a_verifiable_org_signature(
    proxy_factory: Any, victim: tuple[Recorder, ThreadServer]
) -> None:
    recorder, server = victim
    secret = secrets.token_urlsafe(32)
    proxy: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("signed", server.url, secret),))
    with proxy.client() as c:
        c.put("/tools/lookup", json={"tier": "safe", "upstream": "signed"}).raise_for_status()
        response = call(c, "lookup", {"q": 1})
    assert response.status_code == 200, response.text
    [request] = recorder.requests
    headers = request["headers"]
    effect_id = orjson.loads(request["body"])["effect_id"]
    assert effect_id == response.json()["effect_id"]
    assert headers[ORG_HEADER.lower()] == proxy.org_id
    assert headers[SIGNATURE_HEADER.lower()].startswith("v2=")
    method, path, body = request["method"], request["path"], request["body"]
    verified = verify_request(secret, headers, method, path, body)
    assert (verified.org_id, verified.tool, verified.effect_id) == (
        proxy.org_id,
        "lookup",
        effect_id,
    )
    for wrong in (
        lambda: verify_request("another secret", headers, method, path, body),
        lambda: verify_request(secret, headers, method, path, body.replace(b"1", b"2")),
        lambda: verify_request(secret, headers, method, "/tools/other", body),
        lambda: verify_request(secret, headers, "PUT", path, body),
    ):
        with pytest.raises(InvalidUpstreamSignature):
            wrong()


def test_a_captured_echo_call_replayed_as_transfer_funds_is_refused(
    proxy_factory: Any, victim: tuple[Recorder, ThreadServer]
) -> None:
    # Issue 22: the v1 signature covered only org, effect and time, so a captured call could
    # be sent again to any tool with any arguments. The v2 one binds path, tool and body.
    recorder, server = victim
    secret = secrets.token_urlsafe(32)
    proxy: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("signed", server.url, secret),))
    with proxy.client() as c:
        c.put("/tools/echo", json={"tier": "safe", "upstream": "signed"}).raise_for_status()
        assert call(c, "echo", {"hello": 1}).status_code == 200
    [captured] = recorder.requests
    demo = create_demo_tools_app(secret=secret, inspect=True)
    body = orjson.loads(captured["body"])
    theft = {"from_account": "acme-main", "to_account": "mallory", "amount": 500}
    replays = {
        "as transfer_funds": ("/tools/transfer_funds", orjson.dumps({**body, "args": theft})),
        "same body, other tool": ("/tools/transfer_funds", captured["body"]),
        "same tool, other args": ("/tools/echo", orjson.dumps({**body, "args": theft})),
    }

    signed = {k: v for k, v in captured["headers"].items() if k.startswith("x-undolog-")}

    async def send(path: str, content: bytes) -> httpx.Response:
        transport = httpx.ASGITransport(app=demo)
        async with httpx.AsyncClient(transport=transport, base_url="http://demo") as client:
            return await client.post(path, content=content, headers=signed)

    for path, content in replays.values():
        refused = asyncio.run(send(path, content))
        assert refused.status_code == 401, refused.text
    assert list(demo.state.demo.calls) == []
    assert demo.state.demo.tenant(proxy.org_id).transfers == {}
    # The capture itself is genuine: sent as it was, within the window, it verifies.
    assert asyncio.run(send(captured["path"], captured["body"])).status_code == 200


def test_an_upstreams_cookie_never_travels_with_another_call(
    two_orgs: TwoOrgs, victim: tuple[Recorder, ThreadServer]
) -> None:
    # An upstream that sets a cookie on org a's call: were the proxy's one HTTP client to keep
    # it, org b's calls to the same upstream would carry org a's session to it.
    recorder, server = victim
    recorder.set_cookie = "sid=ORG-A-SESSION; Path=/"
    proxy = two_orgs.start(server.url.replace("127.0.0.1", "localhost"))  # a name, not an IP
    for org in ("a", "b", "a"):
        with proxy.client(org) as c:
            c.put("/tools/lookup", json={"tier": "safe"}).raise_for_status()
            response = call(c, "lookup", {"org": org})
        assert response.status_code == 200, response.text
    assert len(recorder.requests) == 3
    assert [r["headers"].get("cookie") for r in recorder.requests] == [None, None, None]


@pytest.fixture
def signed_demo() -> Iterator[tuple[ThreadServer, str]]:
    """The demo tool server holding an upstream secret."""
    secret = secrets.token_urlsafe(32)
    server = ThreadServer(create_demo_tools_app(secret=secret, inspect=True)).start()
    try:
        yield server, secret
    finally:
        server.stop()


def test_calls_and_compensations_pass_a_verifying_demo_tool_server(
    proxy_factory: Any, signed_demo: tuple[ThreadServer, str]
) -> None:
    server, secret = signed_demo
    proxy: ProxyHarness = proxy_factory(upstream_url=server.url, upstream_secret=secret)
    session = str(uuid.uuid4())
    with proxy.client() as c:
        sent = call(c, "send_email", EMAIL, session)
        assert sent.status_code == 200, sent.text
        assert sent.json()["result"]["success"] is True
        rollback = c.post(f"/sessions/{session}/rollback")
        assert rollback.status_code == 200, rollback.text
    state = httpx.get(f"{server.url}/state", params={"org": proxy.org_id}).json()
    [message] = state["messages"].values()
    assert message["status"] == "recalled"  # the signed compensation ran
    calls = httpx.get(f"{server.url}/calls").json()
    assert [(c["tool"], c["org"]) for c in calls] == [
        ("send_email", proxy.org_id),
        ("undo_send_email", proxy.org_id),
    ]


def test_a_proxy_with_the_wrong_secret_runs_nothing_on_a_verifying_tool_server(
    proxy_factory: Any, signed_demo: tuple[ThreadServer, str]
) -> None:
    server, _ = signed_demo
    proxy: ProxyHarness = proxy_factory(upstream_url=server.url, upstream_secret="wrong")
    with proxy.client() as c:
        response = call(c, "send_email", EMAIL)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["success"] is False
    assert httpx.get(f"{server.url}/calls").json() == []


def demo_post(server: ThreadServer, tool: str, effect_id: str, headers: dict[str, str]) -> Any:
    body = orjson.dumps({"args": EMAIL, "session_id": "s", "effect_id": effect_id})
    return httpx.post(f"{server.url}/tools/{tool}", content=body, headers=headers, timeout=10)


def sign(
    secret: str, org: str, tool: str, effect_id: str, args: Any = EMAIL, now: float | None = None
) -> dict[str, str]:
    """The headers the proxy would send with `demo_post`'s body."""
    body = orjson.dumps({"args": args, "session_id": "s", "effect_id": effect_id})
    return signed_headers(
        secret, org_id=org, method="POST", path=f"/tools/{tool}", tool=tool, body=body,
        effect_id=effect_id, now=now,
    )  # fmt: skip


def test_the_demo_tool_server_rejects_forged_or_absent_signatures_with_401(
    signed_demo: tuple[ThreadServer, str], subtests: pytest.Subtests
) -> None:
    server, secret = signed_demo
    effect = str(uuid.uuid4())
    good = sign(secret, "acme", "send_email", effect)
    forged = {
        "no headers": {},
        "org header only": {ORG_HEADER: "acme"},
        "signed with another secret": sign("guess", "acme", "send_email", effect),
        "signature of another effect": sign(secret, "acme", "send_email", "other-effect"),
        "signature of another tool": sign(secret, "acme", "echo", effect),
        "signature of other args": sign(secret, "acme", "send_email", effect, {"to": "m"}),
        "org swapped after signing": {**good, ORG_HEADER: "beta"},
        "stale timestamp": sign(secret, "acme", "send_email", effect, now=time.time() - 3600),
        "timestamp changed after signing": {**good, TIMESTAMP_HEADER: str(int(time.time()) + 1)},
        "a timestamp that is no number": {**good, TIMESTAMP_HEADER: "-1e9"},
    }
    for case, headers in forged.items():
        with subtests.test(case):
            response = demo_post(server, "send_email", effect, headers)
            assert response.status_code == 401, response.text
            assert response.json()["success"] is False
    assert httpx.get(f"{server.url}/calls").json() == []
    assert demo_post(server, "send_email", effect, good).status_code == 200
    assert len(httpx.get(f"{server.url}/calls").json()) == 1


def test_the_demo_tool_server_keeps_each_org_apart(
    signed_demo: tuple[ThreadServer, str],
) -> None:
    server, secret = signed_demo
    sent_effect, undo_effect = str(uuid.uuid4()), str(uuid.uuid4())
    sent = demo_post(
        server, "send_email", sent_effect, sign(secret, "acme", "send_email", sent_effect)
    )
    message_id = sent.json()["output"]["message_id"]
    args = {"message_id": message_id}
    body = orjson.dumps({"args": args, "session_id": "s", "effect_id": undo_effect})
    other = httpx.post(
        f"{server.url}/tools/undo_send_email",
        content=body,
        headers=sign(secret, "beta", "undo_send_email", undo_effect, args),
    )
    assert other.status_code == 404  # beta cannot see, let alone recall, acme's message
    acme = httpx.get(f"{server.url}/state", params={"org": "acme"}).json()
    beta = httpx.get(f"{server.url}/state", params={"org": "beta"}).json()
    assert acme["messages"][message_id]["status"] == "sent"
    assert beta["messages"] == {}
    assert httpx.get(f"{server.url}/counters/send_email", params={"org": "beta"}).json() == {}


def test_a_forged_request_to_the_proxy_cannot_make_it_sign_for_another_org(
    proxy_factory: Any, victim: tuple[Recorder, ThreadServer]
) -> None:
    recorder, server = victim
    proxy: ProxyHarness = proxy_factory(upstreams=(UpstreamConfig("rec", server.url, "k"),))
    with proxy.client(headers={ORG_HEADER: "someone-else"}) as c:
        c.put("/tools/lookup", json={"tier": "safe", "upstream": "rec"}).raise_for_status()
        assert call(c, "lookup", {}).status_code == 200
    wait_until(lambda: len(recorder.requests) == 1, what="the upstream call")
    assert recorder.requests[0]["headers"][ORG_HEADER.lower()] == proxy.org_id
