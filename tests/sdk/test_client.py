"""`UndoLogClient` on the wire: which URL, which headers, which client, which body.

Only what an in-process `httpx.MockTransport` can show: the proxy URL's precedence, the
headers and request bodies the client sends, and who owns the HTTP client. What the proxy
answers, and what the SDK does with it, is tested against the real proxy in `test_flows.py`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import free_port
from undolog_sdk.client import DEFAULT_PROXY_URL, UndoLogClient

SESSION = str(uuid.uuid4())
EFFECT = str(uuid.uuid4())


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("UNDOLOG_PROXY_URL", raising=False)
    monkeypatch.delenv("UNDOLOG_API_KEY", raising=False)
    yield


class Recorder:
    """A MockTransport handler that records requests and answers like an SDK-mode proxy."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/mcp/tool_call"):
            return httpx.Response(200, json={"status": "execute", "effect_id": EFFECT})
        if request.url.path.startswith("/tools/"):
            return httpx.Response(200, json={"name": request.url.path.rsplit("/", 1)[1]})
        return httpx.Response(200, json={"effect_id": EFFECT, "state": "committed"})

    def body(self, index: int = -1) -> Any:
        return json.loads(self.requests[index].content)


def mocked(
    handler: Callable[[httpx.Request], httpx.Response], base_url: str = "http://proxy.test"
) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, transport=httpx.MockTransport(handler))


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


# --- the proxy URL: argument, then UNDOLOG_PROXY_URL, then http://localhost:8080 ----------


async def _url_tried_by(client: UndoLogClient) -> str:
    """Send an intercept to a closed port and read back where it went."""
    with pytest.raises(httpx.ConnectError) as caught:
        await client.intercept("org-a", SESSION, "send_email", 1, {})
    return str(caught.value.request.url)


async def test_the_proxy_url_argument_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argument, env = closed_port_url(), closed_port_url()
    monkeypatch.setenv("UNDOLOG_PROXY_URL", env)
    client = UndoLogClient(argument)
    try:
        assert client.proxy_url == argument
        assert await _url_tried_by(client) == argument + "/mcp/tool_call"
    finally:
        await client.aclose()


async def test_without_an_argument_the_proxy_url_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = closed_port_url()
    monkeypatch.setenv("UNDOLOG_PROXY_URL", env)
    client = UndoLogClient()
    try:
        assert client.proxy_url == env
        assert await _url_tried_by(client) == env + "/mcp/tool_call"
    finally:
        await client.aclose()


async def test_without_argument_or_environment_the_proxy_url_is_localhost_8080() -> None:
    client = UndoLogClient()
    try:
        assert DEFAULT_PROXY_URL == "http://localhost:8080"
        assert client.proxy_url == "http://localhost:8080"
        # The client it creates: base_url=proxy_url, timeout=30.0 (the reference's words).
        assert str(client._http.base_url) == "http://localhost:8080"
        assert client._http.timeout == httpx.Timeout(30.0)
    finally:
        await client.aclose()


# --- headers and bodies -----------------------------------------------------------------


async def test_intercept_posts_the_call_with_the_reference_headers_and_sdk_mode() -> None:
    recorder = Recorder()
    async with mocked(recorder) as http:
        client = UndoLogClient(http_client=http, api_key="ul_key")
        await client.intercept("org-a", SESSION, "send_email", 3, {"to": "ada"})
    (request,) = recorder.requests
    assert request.method == "POST"
    assert str(request.url) == "http://proxy.test/mcp/tool_call"
    assert request.headers["X-UndoLog-Org-Id"] == "org-a"
    assert request.headers["X-UndoLog-Session-Id"] == SESSION
    assert request.headers["X-Api-Key"] == "ul_key"
    assert recorder.body() == {
        "session_id": SESSION,
        "tool_name": "send_email",
        "step_index": 3,
        "args": {"to": "ada"},
        "mode": "sdk",
    }


async def test_commit_and_fail_post_to_the_effect_routes_with_the_same_headers() -> None:
    recorder = Recorder()
    async with mocked(recorder) as http:
        client = UndoLogClient(http_client=http, api_key="ul_key")
        await client.commit("org-a", SESSION, EFFECT, {"ok": True})
        await client.fail("org-a", SESSION, EFFECT, "boom")
    commit, fail = recorder.requests
    assert (commit.method, commit.url.path) == ("POST", f"/effects/{EFFECT}/commit")
    assert recorder.body(0) == {"result": {"ok": True}}
    assert (fail.method, fail.url.path) == ("POST", f"/effects/{EFFECT}/fail")
    assert recorder.body(1) == {"error": "boom"}
    for request in (commit, fail):
        assert request.headers["X-UndoLog-Org-Id"] == "org-a"
        assert request.headers["X-UndoLog-Session-Id"] == SESSION
        assert request.headers["X-Api-Key"] == "ul_key"


async def test_the_api_key_comes_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UNDOLOG_API_KEY", "ul_from_env")
    recorder = Recorder()
    async with mocked(recorder) as http:
        await UndoLogClient(http_client=http).intercept("org-a", SESSION, "t", 1, {})
        await UndoLogClient(http_client=http, api_key="ul_given").intercept(
            "org-a", SESSION, "t", 1, {}
        )
    assert [r.headers["X-Api-Key"] for r in recorder.requests] == ["ul_from_env", "ul_given"]


async def test_without_any_api_key_no_key_header_is_sent() -> None:
    recorder = Recorder()
    async with mocked(recorder) as http:
        await UndoLogClient(http_client=http).intercept("org-a", SESSION, "t", 1, {})
    assert "X-Api-Key" not in recorder.requests[0].headers


async def test_register_tool_puts_the_tool_once_per_client_and_org() -> None:
    recorder = Recorder()
    compensation = {"fn_name": "undo_send_email"}
    async with mocked(recorder) as http:
        client = UndoLogClient(http_client=http, api_key="k")
        for _ in range(3):
            await client.register_tool("org-a", "send_email", "compensable", compensation)
        await client.register_tool("org-b", "send_email", "compensable", compensation)
    assert [(r.method, r.url.path, r.headers["X-UndoLog-Org-Id"]) for r in recorder.requests] == [
        ("PUT", "/tools/send_email", "org-a"),
        ("PUT", "/tools/send_email", "org-b"),
    ]
    assert recorder.body(0) == {"tier": "compensable", "compensation": compensation}


# --- who owns the HTTP client -------------------------------------------------------------


async def test_an_injected_http_client_is_used_with_its_base_url_and_not_closed() -> None:
    recorder = Recorder()
    async with mocked(recorder, base_url="http://elsewhere.test/prefix") as http:
        client = UndoLogClient("http://ignored.test", http_client=http)
        await client.intercept("org-a", SESSION, "t", 1, {})
        await client.aclose()
        assert not http.is_closed
        await client.intercept("org-a", SESSION, "t", 2, {})  # still usable
    assert [str(r.url) for r in recorder.requests] == [
        "http://elsewhere.test/prefix/mcp/tool_call"
    ] * 2


async def test_aclose_closes_a_client_the_sdk_created() -> None:
    client = UndoLogClient(closed_port_url())
    await client.aclose()
    with pytest.raises(RuntimeError):
        await client.intercept("org-a", SESSION, "t", 1, {})
