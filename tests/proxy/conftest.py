"""A real proxy (uvicorn on a loopback port) in front of a real demo tool server, per test.

`proxy` runs in a thread of the test process; `ProxyHarness.client()` gives an httpx client
with the org's `admin` key (`api_key`); `agent_key` and `approver_key` are the org's keys of
the other two roles. For kill -9 tests, `spawn_proxy` starts `python -m undolog serve` as a
child process on the same store.

The config is the source of truth for keys, so a proxy started later in a test lists the
orgs (and keys) of the proxies started before it: otherwise its start would revoke them.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.receiver import Receiver
from tests.support.servers import ProcessServer, ThreadServer, free_port, undolog_command
from undolog.config import KeyConfig, OrgConfig, Settings, hash_api_key
from undolog.demo.catalog import DEMO_TOOLS
from undolog.demo.tools import create_demo_tools_app

# The proxies of the tests serve /metrics on the main port to this bearer token.
TEST_METRICS_TOKEN = "test-metrics-token-" + "m" * 24
METRICS_AUTH = {"Authorization": f"Bearer {TEST_METRICS_TOKEN}"}


@dataclass
class ProxyHarness:
    url: str
    upstream_url: str
    database_url: str
    org_id: str
    api_key: str
    settings: Settings
    extra: dict[str, Any] = field(default_factory=dict)
    server: ThreadServer | None = None
    agent_key: str = ""
    approver_key: str = ""

    @property
    def runtime(self) -> Any:
        """The in-process proxy's `Runtime` (store, engine, broker, metrics...)."""
        assert self.server is not None, "only a proxy run in a thread has a runtime here"
        return self.server.app.fastapi.state.runtime

    def client(self, api_key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"X-Api-Key": api_key or self.api_key, **kwargs.pop("headers", {})}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kwargs)

    def async_client(self, api_key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"X-Api-Key": api_key or self.api_key, **kwargs.pop("headers", {})}
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        return httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=30, limits=limits, **kwargs
        )

    def upstream(self) -> httpx.Client:
        return httpx.Client(base_url=self.upstream_url, timeout=30)

    def counters(self, tool: str) -> dict[str, int]:
        with self.upstream() as c:
            data: dict[str, int] = c.get(f"/counters/{tool}").json()
            return data

    def register_demo_tools(self, org_api_key: str | None = None) -> None:
        with self.client(org_api_key) as c:
            for name, spec in DEMO_TOOLS.items():
                c.put(f"/tools/{name}", json=spec).raise_for_status()


def _new_org() -> tuple[str, str]:
    return f"org-{secrets.token_hex(6)}", new_key()


def new_key() -> str:
    return "ul_test_" + secrets.token_urlsafe(18)


def role_keys(
    admin: str, agent: str | None = None, approver: str | None = None
) -> tuple[KeyConfig, ...]:
    """`[[orgs.keys]]` for an admin key and, if given, an agent and an approver key."""
    keys = [KeyConfig(name="admin", role="admin", key_hash=hash_api_key(admin))]
    if agent:
        keys.append(KeyConfig(name="agent", role="agent", key_hash=hash_api_key(agent)))
    if approver:
        keys.append(KeyConfig(name="approver", role="approver", key_hash=hash_api_key(approver)))
    return tuple(keys)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on a reserved port, not started (down) until the test starts it."""
    hook = Receiver()
    try:
        yield hook
    finally:
        hook.stop()


@pytest.fixture
def demo_upstream() -> Iterator[ThreadServer]:
    server = ThreadServer(create_demo_tools_app(inspect=True)).start()
    try:
        yield server
    finally:
        server.stop()


def make_settings(
    database_url: str, upstream_url: str, orgs: tuple[OrgConfig, ...], **overrides: Any
) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "upstream_url": upstream_url,
        "upstream_timeout_seconds": 10.0,
        "lease_seconds": 30.0,
        "log_level": "warning",
        "metrics_token": TEST_METRICS_TOKEN,
        "orgs": orgs,
        "spool_dir": tempfile.mkdtemp(prefix="undolog-spool-"),
        # Many tests make and approve a call with the org's one admin key, so the harness
        # allows it; the product's default (off) is tested with it off, explicitly
        # (tests/proxy/test_approval_binding.py).
        "allow_self_approval": True,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def proxy_factory(store_url: str, demo_upstream: ThreadServer) -> Iterator[Any]:
    """Start proxies (in threads) on the parametrised store; each gets a fresh org and key."""
    from undolog.proxy import create_app

    started: list[ThreadServer] = []
    orgs_so_far: list[OrgConfig] = []

    def start(
        org_options: dict[str, Any] | None = None, *, org_id: str | None = None, **overrides: Any
    ) -> ProxyHarness:
        """A proxy with its own org (`org_id`, or a fresh one); `org_options` are extra
        `OrgConfig` fields (for example `approval_timeout_seconds`, `auto_approve_on_timeout`),
        `overrides` are `Settings`."""
        fresh_org, key = _new_org()
        org_id = org_id or fresh_org
        agent, approver = new_key(), new_key()
        orgs_so_far.append(
            OrgConfig(org_id=org_id, keys=role_keys(key, agent, approver), **(org_options or {}))
        )
        upstream = overrides.pop("upstream_url", demo_upstream.url)
        settings = make_settings(store_url, upstream, tuple(orgs_so_far), **overrides)
        server = ThreadServer(create_app(settings), settings=settings).start()
        started.append(server)
        harness = ProxyHarness(
            server.url, demo_upstream.url, store_url, org_id, key, settings, server=server,
            agent_key=agent, approver_key=approver,
        )  # fmt: skip
        harness.register_demo_tools()
        return harness

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture
def proxy(proxy_factory: Any) -> ProxyHarness:
    harness: ProxyHarness = proxy_factory()
    return harness


def spawn_proxy(
    database_url: str,
    upstream_url: str,
    config_path: Path,
    *,
    log_path: Path | None = None,
    **env: str,
) -> ProcessServer:
    """`python -m undolog serve` as a child process (so a test can kill -9 it)."""
    port = free_port()
    server_env = {
        "UNDOLOG_DATABASE_URL": database_url,
        "UNDOLOG_UPSTREAM_URL": upstream_url,
        "UNDOLOG_CONFIG": str(config_path),
        "UNDOLOG_PORT": str(port),
        "UNDOLOG_LOG_LEVEL": "warning",
        # Held results go next to the config (the test's tmp dir), never into the repo.
        "UNDOLOG_SPOOL_DIR": str(config_path.parent / f"spool-{port}"),  # one per process
        "UNDOLOG_METRICS_TOKEN": TEST_METRICS_TOKEN,
        "UNDOLOG_ALLOW_SELF_APPROVAL": "true",  # one admin key calls and approves (make_settings)
        **env,
    }
    return ProcessServer(
        undolog_command("serve"),
        env=server_env,
        port=port,
        log_path=str(log_path) if log_path else None,
    ).start()


def write_org_config(
    path: Path,
    org_id: str,
    api_key: str,
    *,
    approval_timeout_seconds: int | None = None,
    auto_approve_on_timeout: bool | None = None,
) -> Path:
    """A TOML config declaring one org with one admin key (stored as its SHA-256), and
    optionally its approval timeout policy."""
    text = org_toml(org_id, api_key, approval_timeout_seconds=approval_timeout_seconds,
                    auto_approve_on_timeout=auto_approve_on_timeout)  # fmt: skip
    path.write_text(text, encoding="utf-8")
    return path


def org_toml(
    org_id: str,
    api_key: str,
    *,
    approval_timeout_seconds: int | None = None,
    auto_approve_on_timeout: bool | None = None,
) -> str:
    """The `[[orgs]]` table of one org with one admin key (see `write_org_config`)."""
    text = f'[[orgs]]\nid = "{org_id}"\n'
    if approval_timeout_seconds is not None:
        text += f"approval_timeout_seconds = {approval_timeout_seconds}\n"
    if auto_approve_on_timeout is not None:
        text += f"auto_approve_on_timeout = {str(auto_approve_on_timeout).lower()}\n"
    return (
        text
        + f'[[orgs.keys]]\nname = "admin"\nrole = "admin"\nsha256 = "{hash_api_key(api_key)}"\n'
    )
