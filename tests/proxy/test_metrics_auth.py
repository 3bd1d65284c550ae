"""`/metrics` is no longer public (issue 11: it listed every org id to anyone).

On the main port it answers only `Authorization: Bearer <metrics_token>`; without a token
configured it is not served there (404, saying how to enable it). `metrics_port` serves it on
a separate listener without auth, meant for a private interface. No store is involved, so
these run on SQLite only.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import METRICS_AUTH, TEST_METRICS_TOKEN, ProxyHarness
from tests.support.servers import free_port, undolog_command
from undolog.config import load_settings

pytestmark = pytest.mark.security


@pytest.fixture
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'undolog.db'}"


def org_seen(proxy: ProxyHarness) -> None:
    """Make the org appear in the metrics (an open event stream is labelled with it)."""
    with proxy.client() as c, c.stream("GET", "/events") as stream:
        assert stream.status_code == 200
        assert proxy_metrics(proxy, METRICS_AUTH).status_code == 200


def proxy_metrics(proxy: ProxyHarness, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{proxy.url}/metrics", headers=headers, timeout=10)


def test_metrics_on_the_main_port_need_the_bearer_token(proxy: ProxyHarness) -> None:
    org_seen(proxy)
    refused = {
        "no header": proxy_metrics(proxy, {}),
        "a wrong token": proxy_metrics(proxy, {"Authorization": "Bearer nope"}),
        "the token without Bearer": proxy_metrics(proxy, {"Authorization": TEST_METRICS_TOKEN}),
        "basic auth": proxy_metrics(proxy, {"Authorization": "Basic dTpw"}),
        "an API key": proxy_metrics(proxy, {"X-Api-Key": proxy.api_key}),
        "an API key as bearer": proxy_metrics(proxy, {"Authorization": f"Bearer {proxy.api_key}"}),
    }
    for case, response in refused.items():
        assert (response.status_code, response.json()["code"]) == (401, "auth_failed"), case
        assert "metrics_token" in response.json()["message"], case
        assert response.headers["WWW-Authenticate"] == "Bearer", case
        assert proxy.org_id not in response.text, case
    allowed = proxy_metrics(proxy, METRICS_AUTH)
    assert allowed.status_code == 200
    assert allowed.headers["content-type"].startswith("text/plain")
    assert "undolog_proxy_http_requests_total" in allowed.text


def test_without_a_token_metrics_are_not_served_on_the_main_port(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(metrics_token=None)
    for headers in ({}, METRICS_AUTH, {"Authorization": "Bearer x"}):
        response = proxy_metrics(proxy, headers)
        assert (response.status_code, response.json()["code"]) == (404, "not_found")
        message = response.json()["message"]
        assert "metrics_token" in message and "metrics_port" in message
        assert response.headers["X-Request-Id"] == response.json()["request_id"]


def test_a_separate_listener_serves_metrics_without_auth(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    port = free_port()
    proxy = proxy_factory(metrics_token=None, metrics_port=port, metrics_host="127.0.0.1")
    with proxy.client() as c:
        c.get("/tools").raise_for_status()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as private:
        scraped = private.get("/metrics")
        elsewhere = [private.get("/tools"), private.get("/health"), private.post("/metrics")]
    assert scraped.status_code == 200
    assert 'undolog_proxy_http_requests_total{route="/tools",status="200"} 1.0' in scraped.text
    assert [r.status_code for r in elsewhere] == [404, 404, 404]
    assert proxy_metrics(proxy, {}).status_code == 404  # still not on the main port


def test_wrong_metrics_tokens_count_toward_the_failure_limit(
    proxy_factory: Callable[..., ProxyHarness],
) -> None:
    proxy = proxy_factory(auth_failure_limit=3)
    wrong = {"Authorization": "Bearer guess"}
    codes = [proxy_metrics(proxy, wrong).status_code for _ in range(4)]
    assert codes == [401, 401, 401, 429]
    assert proxy_metrics(proxy, METRICS_AUTH).status_code == 200  # the right one still works


def test_metrics_settings_come_from_flags_env_and_the_server_table(tmp_path: Path) -> None:
    config = tmp_path / "undolog.toml"
    config.write_text(
        '[server]\nmetrics_token = "from-file"\nmetrics_port = 9464\nmetrics_host = "10.0.0.5"\n',
        encoding="utf-8",
    )
    from_file = load_settings({"config": str(config)}, env={})
    assert (from_file.metrics_token, from_file.metrics_host, from_file.metrics_port) == (
        "from-file",
        "10.0.0.5",
        9464,
    )
    from_env = load_settings(
        {"config": str(config)}, env={"UNDOLOG_METRICS_TOKEN": "env", "UNDOLOG_METRICS_PORT": "1"}
    )
    assert (from_env.metrics_token, from_env.metrics_port) == ("env", 1)
    from_flag = load_settings({"metrics_token": "flag"}, env={"UNDOLOG_METRICS_TOKEN": "env"})
    assert (from_flag.metrics_token, from_flag.metrics_port) == ("flag", None)
    with pytest.raises(ValueError, match="metrics_port"):
        load_settings({"metrics_port": "nine"}, env={})


def test_a_metrics_port_in_use_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    """`undolog serve` exits non-zero, naming the address, when the listener cannot bind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {
            "UNDOLOG_DATABASE_URL": f"sqlite:///{tmp_path / 'u.db'}",
            "UNDOLOG_PORT": str(free_port()),
            "UNDOLOG_METRICS_PORT": str(port),
            "PATH": "/usr/bin:/bin",
        }
        done = subprocess.run(
            undolog_command("serve"), env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode != 0
    assert f"127.0.0.1:{port}" in done.stderr + done.stdout
