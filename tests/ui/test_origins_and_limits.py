"""Dashboard Origin checks against configured origins (not the Host header: DNS rebinding),
and the per-address limit on failed sign-ins and key checks (issue 11). Plain HTTP to a
real proxy, on SQLite (the checks sit in front of the store)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from undolog.config import load_settings
from undolog_sdk.errors import AuthFailed, RateLimited

pytestmark = pytest.mark.security

UI = {"X-Requested-With": "undolog-ui"}
SECRET = "origin-test-ui-secret"


@pytest.fixture
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'undolog.db'}"


def port_of(proxy: ProxyHarness) -> int:
    return int(proxy.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def signed_in(proxy: ProxyHarness) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        c.post("/ui/login", json={"api_key": proxy.api_key}, headers=UI).raise_for_status()
        yield c


def active_session(proxy: ProxyHarness) -> str:
    session = str(uuid.uuid4())
    with proxy.client() as agent:
        body = {"session_id": session, "tool_name": "echo", "step_index": 1, "args": {}}
        agent.post("/mcp/tool_call", json=body).raise_for_status()
    return session


def state_of(proxy: ProxyHarness, session: str) -> str:
    with proxy.client() as agent:
        state: str = agent.get(f"/sessions/{session}").json()["state"]
    return state


# -- origins ---------------------------------------------------------------------------------


def test_dns_rebinding_host_and_origin_both_evil_are_refused(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    """The attacker's name resolves to this server: Host and Origin agree, and are refused."""
    proxy = proxy_factory(ui_secret=SECRET)
    evil = f"evil.example:{port_of(proxy)}"
    session = active_session(proxy)
    with signed_in(proxy) as c:
        rebound = {"Host": evil, "Origin": f"http://{evil}"}
        answers = {
            "rollback, Host and Origin evil": c.post(
                f"/sessions/{session}/rollback", headers=rebound
            ),
            "rollback, Host evil, no Origin, X-Requested-With": c.post(
                f"/sessions/{session}/rollback", headers={"Host": evil, **UI}
            ),
            "rollback, Host evil, Origin evil, X-Requested-With": c.post(
                f"/sessions/{session}/rollback", headers={**rebound, **UI}
            ),
            "sign-in, Host and Origin evil": c.post(
                "/ui/login", json={"api_key": proxy.api_key}, headers={**rebound, **UI}
            ),
            "sign-out, Host and Origin evil": c.post("/ui/logout", headers={**rebound, **UI}),
        }
        for case, answer in answers.items():
            assert answer.status_code == 403, (case, answer.text)
            assert answer.json()["code"] == AuthFailed.code, case
            assert "set-cookie" not in answer.headers, case
        assert state_of(proxy, session) == "active"
        same = c.post(
            f"/sessions/{session}/rollback",
            headers={"Origin": f"http://localhost:{port_of(proxy)}"},
        )
    assert same.status_code == 200, same.text
    assert state_of(proxy, session) == "compensated"


def test_the_default_origins_are_this_servers_own_address_and_localhost(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(ui_secret=SECRET)
    port = port_of(proxy)
    with signed_in(proxy) as c:
        codes = {
            origin: c.post("/ui/logout", headers={"Origin": origin}).status_code
            for origin in (
                f"http://127.0.0.1:{port}",
                f"http://LOCALHOST:{port}",
                f"http://127.0.0.1:{port}/",
                f"http://127.0.0.1:{port + 1}",
                f"https://127.0.0.1:{port}",
                "http://127.0.0.1",
                "null",
                "http://[::1",
            )
        }
    assert codes == {
        f"http://127.0.0.1:{port}": 200,
        f"http://LOCALHOST:{port}": 200,
        f"http://127.0.0.1:{port}/": 200,
        f"http://127.0.0.1:{port + 1}": 403,
        f"https://127.0.0.1:{port}": 403,
        "http://127.0.0.1": 403,
        "null": 403,
        "http://[::1": 403,
    }


def test_configured_origins_replace_the_defaults(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    """Behind a TLS reverse proxy: the dashboard's public origin, whatever Host says."""
    proxy = proxy_factory(ui_secret=SECRET, allowed_origins=("https://undolog.example.com",))
    session = active_session(proxy)
    with signed_in_from(proxy, "https://undolog.example.com") as c:
        own = c.post(
            f"/sessions/{session}/rollback",
            headers={"Origin": f"http://127.0.0.1:{port_of(proxy)}"},
        )
        public = c.post(
            f"/sessions/{session}/rollback", headers={"Origin": "https://undolog.example.com"}
        )
        no_origin = c.post(f"/sessions/{session}/rollback", headers=UI)  # Host is 127.0.0.1
    assert own.status_code == 403
    assert no_origin.status_code == 403
    assert public.status_code == 200, public.text


@contextlib.contextmanager
def signed_in_from(proxy: ProxyHarness, origin: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        refused = c.post("/ui/login", json={"api_key": proxy.api_key}, headers=UI)
        assert refused.status_code == 403  # Host 127.0.0.1 is not a configured origin
        signed = c.post("/ui/login", json={"api_key": proxy.api_key}, headers={"Origin": origin})
        signed.raise_for_status()
        yield c


# -- rate limit -----------------------------------------------------------------------------------


def test_failed_sign_ins_are_limited_per_address_and_a_valid_key_still_signs_in(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(ui_secret=SECRET, auth_failure_limit=3, auth_failure_window_seconds=600)
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        wrong = [
            c.post("/ui/login", json={"api_key": f"ul_guess_{n}"}, headers=UI) for n in range(5)
        ]
        valid = c.post("/ui/login", json={"api_key": proxy.api_key}, headers=UI)
    assert [w.status_code for w in wrong] == [401, 401, 401, 429, 429]
    limited = wrong[3]
    assert limited.json()["code"] == RateLimited.code
    retry_after = int(limited.headers["Retry-After"])
    assert 1 <= retry_after <= 600
    assert limited.json()["retry_after"] == retry_after
    assert "set-cookie" not in limited.headers
    assert valid.status_code == 200, valid.text


def test_failed_key_checks_are_limited_and_valid_keys_never_slowed(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(auth_failure_limit=4, auth_failure_window_seconds=600)
    with proxy.client() as good, proxy.client(api_key="ul_wrong") as bad:
        answers = []
        for _ in range(6):
            answers.append(bad.get("/tools").status_code)
            assert good.get("/tools").status_code == 200  # interleaved, never refused
        login = httpx.post(
            f"{proxy.url}/ui/login", json={"api_key": "ul_wrong"}, headers=UI, timeout=30
        )
        missing = httpx.get(f"{proxy.url}/tools", timeout=30)  # no key: no guess, not counted
    assert answers == [403, 403, 403, 403, 429, 429]
    assert login.status_code == 429  # one budget per address for keys and sign-ins
    assert missing.status_code == 401


def test_allowed_origins_come_from_flags_env_and_the_server_table(tmp_path: Path) -> None:
    config = tmp_path / "undolog.toml"
    config.write_text(
        '[server]\nallowed_origins = ["https://UndoLog.example.com/"]\n', encoding="utf-8"
    )
    assert load_settings({"config": str(config)}, env={}).allowed_origins == (
        "https://undolog.example.com",
    )
    env = {"UNDOLOG_ALLOWED_ORIGINS": "https://a.example, http://b.example:8080"}
    assert load_settings({}, env=env).allowed_origins == (
        "https://a.example",
        "http://b.example:8080",
    )
    assert load_settings({}, env={}).allowed_origins == ()
    for bad in ("ftp://x.example", "a.example", "https://a.example/ui", '["x"]'):
        with pytest.raises(ValueError, match="allowed_origins"):
            load_settings({"allowed_origins": bad}, env={})
