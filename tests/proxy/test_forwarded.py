"""`X-Forwarded-For` is trusted only from the reverse proxies the operator names (issue 22).

uvicorn trusts it from 127.0.0.1 unless told otherwise, and the proxy binds 127.0.0.1 by
default: any local client could then pick the address its failed key checks count against,
and 40 guesses from one host never met the limit. Through a real server (uvicorn rewrites the
client address in front of the app), on SQLite: the checks sit in front of the store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness
from undolog.config import Settings, load_settings
from undolog.proxy.server import build_config

pytestmark = pytest.mark.security

UI = {"X-Requested-With": "undolog-ui"}
LIMIT = 5
GUESSES = 40


@pytest.fixture
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'undolog.db'}"


def _forwarded(n: int) -> dict[str, str]:
    return {"X-Forwarded-For": f"203.0.113.{n % 250 + 1}"}


def _guesses(proxy: ProxyHarness, kind: str) -> list[int]:
    """GUESSES wrong credentials of one kind, each claiming another client address."""
    codes = []
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        for n in range(GUESSES):
            if kind == "api_key":
                r = c.get("/tools", headers={"X-Api-Key": f"ul_guess_{n}", **_forwarded(n)})
            elif kind == "sign_in":
                r = c.post(
                    "/ui/login", json={"api_key": f"ul_guess_{n}"}, headers={**UI, **_forwarded(n)}
                )
            else:
                r = c.get("/metrics", headers={"Authorization": "Bearer guess", **_forwarded(n)})
            codes.append(r.status_code)
    return codes


@pytest.mark.parametrize("kind", ["api_key", "sign_in", "metrics_token"])
def test_rotating_x_forwarded_for_from_loopback_does_not_escape_the_failure_limit(
    proxy_factory: Callable[..., ProxyHarness], kind: str
) -> None:
    proxy = proxy_factory(auth_failure_limit=LIMIT, auth_failure_window_seconds=600)
    codes = _guesses(proxy, kind)
    assert all(code in (401, 403) for code in codes[:LIMIT]), codes
    assert codes[LIMIT:] == [429] * (GUESSES - LIMIT), codes


def test_a_configured_reverse_proxy_s_x_forwarded_for_names_the_client(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(
        auth_failure_limit=LIMIT, auth_failure_window_seconds=600, forwarded_allow_ips="127.0.0.1"
    )
    # Each forwarded address has its own budget ...
    assert 429 not in _guesses(proxy, "api_key")
    # ... and one forwarded address is limited as a client of its own.
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        one = {"X-Forwarded-For": "198.51.100.7"}
        codes = [
            c.get("/tools", headers={"X-Api-Key": "ul_wrong", **one}).status_code
            for _ in range(LIMIT + 1)
        ]
        other = c.get("/tools", headers={"X-Api-Key": "ul_wrong"}).status_code
    assert codes == [403] * LIMIT + [429]
    assert other == 403  # the reverse proxy's own address is another client


def test_forwarded_headers_are_trusted_only_when_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # uvicorn's own FORWARDED_ALLOW_IPS must not switch it back on behind our back.
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    assert Settings().forwarded_allow_ips == ""
    assert build_config(object(), Settings()).proxy_headers is False
    config = build_config(object(), Settings(forwarded_allow_ips="10.0.0.1,10.1.0.0/16"))
    assert config.proxy_headers is True
    assert config.forwarded_allow_ips == "10.0.0.1,10.1.0.0/16"


def test_forwarded_allow_ips_come_from_flags_env_and_the_server_table(tmp_path: Path) -> None:
    config = tmp_path / "undolog.toml"
    config.write_text('[server]\nforwarded_allow_ips = ["10.0.0.1", "fd00::/8"]\n', "utf-8")
    assert load_settings({"config": str(config)}, env={}).forwarded_allow_ips == (
        "10.0.0.1,fd00::/8"
    )
    env = {"UNDOLOG_FORWARDED_ALLOW_IPS": " 127.0.0.1 , ::1"}
    assert load_settings({}, env=env).forwarded_allow_ips == "127.0.0.1,::1"
    assert load_settings({"forwarded_allow_ips": "*"}, env={}).forwarded_allow_ips == "*"
    assert load_settings({}, env={}).forwarded_allow_ips == ""
    for bad in ("proxy.example", "10.0.0.300", "127.0.0.1/33"):
        with pytest.raises(ValueError, match="forwarded_allow_ips"):
            load_settings({"forwarded_allow_ips": bad}, env={})
