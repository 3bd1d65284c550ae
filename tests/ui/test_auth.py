"""Dashboard sign-in over plain HTTP, on both stores: the cookie, its flags, CSRF, expiry,
tampering, another org, and the `/overview` counts."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from undolog.config import hash_api_key
from undolog.engine.keys import Keys
from undolog.proxy.ui_auth import COOKIE_NAME, SessionTokens
from undolog.store import open_store
from undolog_sdk.errors import AuthFailed, AuthMissing

pytestmark = pytest.mark.security

SECRET = "http-test-ui-secret"
UI = {"X-Requested-With": "undolog-ui"}


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'undolog.db'}"


@pytest.fixture
def ui_proxy(proxy_factory: Any) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory(ui_secret=SECRET)
    return harness


def browser(proxy: ProxyHarness) -> httpx.Client:
    """A client without an API key, like the dashboard's page."""
    return httpx.Client(base_url=proxy.url, timeout=30)


def sign_in(c: httpx.Client, key: str) -> httpx.Response:
    return c.post("/ui/login", json={"api_key": key}, headers=UI)


def error_code(response: httpx.Response) -> str:
    code: str = response.json()["code"]
    return code


def test_signing_in_sets_an_httponly_strict_signed_cookie_without_the_key(
    ui_proxy: ProxyHarness,
) -> None:
    with browser(ui_proxy) as c:
        response = sign_in(c, ui_proxy.api_key)
        assert response.status_code == 200, response.text
        assert response.json()["org_id"] == ui_proxy.org_id
        header = response.headers["set-cookie"]
        attributes = {a.strip().split("=")[0].lower() for a in header.split(";")}
        assert {"httponly", "path", "max-age"} <= attributes
        assert "samesite=strict" in header.lower()
        assert "secure" not in attributes  # plain http on loopback
        token = c.cookies[COOKIE_NAME]
        assert ui_proxy.api_key not in token
        assert hash_api_key(ui_proxy.api_key) not in token
        session_id = SessionTokens(SECRET.encode()).verify(token)
        assert session_id is not None and ui_proxy.org_id not in token
        every = dict.fromkeys(("approve", "reject", "rollback", "undo_retry", "undo_resolve"), True)
        assert c.get("/ui/session").json() == {
            "signed_in": True, "org_id": ui_proxy.org_id, "key_name": "admin", "role": "admin",
            "actions": every,
        }  # fmt: skip
        assert c.get("/sessions").status_code == 200


def test_a_form_sign_in_redirects_to_the_dashboard(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        response = c.post(
            "/ui/login",
            data={"api_key": ui_proxy.api_key},
            headers={"Origin": ui_proxy.url},
        )
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/"
        assert c.get("/overview").status_code == 200


def test_an_unknown_or_missing_key_does_not_sign_in(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        unknown = sign_in(c, "ul_not_a_key")
        assert unknown.status_code == 401
        assert error_code(unknown) == AuthFailed.code
        assert "set-cookie" not in unknown.headers
        assert sign_in(c, "").status_code == 400
        assert c.post("/ui/login", content=b"{", headers=UI).status_code == 400
        assert c.get("/ui/session").json()["signed_in"] is False


def test_signing_in_from_another_site_is_refused(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        response = c.post(
            "/ui/login",
            data={"api_key": ui_proxy.api_key},
            headers={"Origin": "https://evil.example"},
        )
        assert response.status_code == 403
        assert "set-cookie" not in response.headers


def test_signing_out_clears_the_cookie(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        sign_in(c, ui_proxy.api_key)
        response = c.post("/ui/logout", headers=UI)
        assert response.status_code == 200
        assert 'undolog_session=""' in response.headers["set-cookie"]
        assert "max-age=0" in response.headers["set-cookie"].lower()
        assert COOKIE_NAME not in c.cookies
        missing = c.get("/sessions")
        assert missing.status_code == 401
        assert error_code(missing) == AuthMissing.code


def test_signing_out_ends_the_session_server_side(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        sign_in(c, ui_proxy.approver_key)
        kept = c.cookies[COOKIE_NAME]
        assert c.get("/sessions").status_code == 200
        c.post("/ui/logout", headers=UI).raise_for_status()
    # Someone who copied the cookie before sign-out cannot use it after.
    with httpx.Client(base_url=ui_proxy.url, timeout=30, cookies={COOKIE_NAME: kept}) as c:
        replayed = c.get("/sessions")
        assert (replayed.status_code, error_code(replayed)) == (401, AuthMissing.code)
        assert c.get("/ui/session").json()["signed_in"] is False


def test_an_agent_key_cannot_sign_in_to_the_dashboard(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        refused = sign_in(c, ui_proxy.agent_key)
        assert (refused.status_code, error_code(refused)) == (403, "forbidden")
        assert "set-cookie" not in refused.headers
        signed_in = sign_in(c, ui_proxy.approver_key)
        assert signed_in.json()["role"] == "approver"
        # What the page offers it: the permission table's answer for its role.
        assert signed_in.json()["actions"] == {
            "approve": True, "reject": True, "rollback": True,
            "undo_retry": False, "undo_resolve": False,
        }  # fmt: skip


def test_a_revoked_keys_dashboard_session_stops_working(ui_proxy: ProxyHarness) -> None:
    async def revoke_approver() -> None:
        store = await open_store(ui_proxy.database_url)
        try:
            keys = Keys(store)
            (approver,) = [k for k in await keys.list(ui_proxy.org_id) if k.name == "approver"]
            await keys.revoke(approver.key_id)
        finally:
            await store.close()

    with browser(ui_proxy) as c:
        sign_in(c, ui_proxy.approver_key).raise_for_status()
        assert c.get("/sessions").status_code == 200
        asyncio.run(revoke_approver())
        ended = c.get("/sessions")  # at once: the session is checked against the store
        assert (ended.status_code, error_code(ended)) == (401, AuthMissing.code)
        assert c.get("/ui/session").json()["signed_in"] is False


def test_a_cookie_state_change_needs_the_same_origin_check(ui_proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())
    with ui_proxy.client() as agent:
        agent.post(
            "/mcp/tool_call",
            json={"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}},
        ).raise_for_status()
    with browser(ui_proxy) as c:
        sign_in(c, ui_proxy.api_key)
        forged = c.post(f"/sessions/{session}/rollback")
        assert forged.status_code == 403
        assert error_code(forged) == AuthFailed.code
        cross_site = c.post(
            f"/sessions/{session}/rollback", headers={"Origin": "https://evil.example"}
        )
        assert cross_site.status_code == 403
        with ui_proxy.client() as agent:
            assert agent.get(f"/sessions/{session}").json()["state"] == "active"
        same_site = c.post(f"/sessions/{session}/rollback", headers={"Origin": ui_proxy.url})
        assert same_site.status_code == 200, same_site.text
        assert same_site.json()["outcome"] == "compensated"


def test_an_expired_tampered_or_unknown_token_is_refused(ui_proxy: ProxyHarness) -> None:
    with browser(ui_proxy) as c:
        sign_in(c, ui_proxy.api_key).raise_for_status()
        valid = c.cookies[COOKIE_NAME]
    tokens = SessionTokens(SECRET.encode(), ttl_seconds=60)
    session_id = tokens.verify(valid)
    assert session_id is not None
    expired, _ = tokens.issue(session_id, now=0)
    head, _, tail = valid.partition(".")
    other, _ = tokens.issue("a-session-that-was-never-started")
    forged_head = other.partition(".")[0]
    wrong_secret, _ = SessionTokens(b"another secret").issue(session_id)
    bad = {
        "well signed but never started": other,
        "expired": expired,
        "tampered payload": f"{forged_head}.{tail}",
        "tampered signature": f"{head}.{tail[:-2]}AA",
        "wrong secret": wrong_secret,
        "no signature": head,
        "garbage": "%%%.***",
    }
    for what, token in bad.items():
        with httpx.Client(base_url=ui_proxy.url, timeout=30, cookies={COOKIE_NAME: token}) as c:
            response = c.get("/sessions")
            assert response.status_code == 401, what
            assert error_code(response) == AuthMissing.code, what
            assert c.get("/ui/session").json()["signed_in"] is False, what
    with httpx.Client(base_url=ui_proxy.url, timeout=30, cookies={COOKIE_NAME: valid}) as c:
        assert c.get("/sessions").status_code == 200


def test_a_session_is_scoped_to_its_org(proxy_factory: Any) -> None:
    first = proxy_factory(ui_secret=SECRET)
    second = proxy_factory(ui_secret=SECRET)  # another org on the same store
    session = str(uuid.uuid4())
    with first.client() as agent:
        agent.post(
            "/mcp/tool_call",
            json={"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}},
        ).raise_for_status()
    with browser(second) as c:
        sign_in(c, second.api_key)
        assert c.get(f"/sessions/{session}").status_code == 404
        assert c.get("/sessions").json() == []
        assert c.get("/overview").json()["calls"] == 0
        # An API key header wins over the cookie; a claimed org must match the cookie's.
        header = c.get(f"/sessions/{session}", headers={"X-Api-Key": first.api_key})
        assert header.status_code == 200
        claimed = c.get("/sessions", headers={"X-Org-Id": first.org_id})
        assert claimed.status_code == 403


def test_overview_counts_calls_replays_approvals_and_sessions(ui_proxy: ProxyHarness) -> None:
    session = str(uuid.uuid4())

    def call(tool: str, step: int) -> httpx.Response:
        return agent.post(
            "/mcp/tool_call",
            json={
                "session_id": session,
                "tool_name": tool,
                "step_index": step,
                "args": {"n": step},
            },
        )

    with ui_proxy.client() as agent:
        assert call("echo", 1).json()["status"] == "executed"
        assert call("echo", 1).json()["status"] == "replayed"
        assert call("echo", 2).json()["status"] == "executed"
        assert call("delete_database", 3).status_code == 202
        counts = agent.get("/overview").json()
    assert counts["calls"] == 3
    assert counts["replays"] == 1
    assert counts["pending_approvals"] == 1
    assert counts["sessions"] == 1
    assert counts["sessions_by_state"] == {"active": 1}
    assert counts["effects_by_state"] == {"committed": 2, "awaiting_approval": 1}
    assert counts["sessions_compensating"] == 0
    assert counts["sessions_needing_attention"] == 0


def test_the_ui_secret_is_a_setting_with_an_env_var_and_a_flag() -> None:
    from typer.testing import CliRunner

    from undolog.cli import app
    from undolog.config import load_settings

    assert load_settings({}, {}).ui_secret is None
    assert load_settings({}, {"UNDOLOG_UI_SECRET": "from-env"}).ui_secret == "from-env"
    flagged = load_settings({"ui_secret": "from-flag"}, {"UNDOLOG_UI_SECRET": "from-env"})
    assert flagged.ui_secret == "from-flag"
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "--ui-secret" in help_text
    assert "UNDOLOG_UI_SECRET" in help_text
