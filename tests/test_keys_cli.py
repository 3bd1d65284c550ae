"""`undolog keys create|list|revoke` end to end, on both stores, against a real proxy.

The command talks to the database; the proxy (a child process, restarted in between) reads
it. A CLI key survives restarts (the config only revokes its own keys), `list` never shows a
key or its hash, and a revoked key stops working within the proxy's key cache time.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.proxy.conftest import new_key, spawn_proxy, write_org_config
from tests.support.servers import ProcessServer, ThreadServer, wait_until
from tests.test_cli import run
from undolog.config import hash_api_key
from undolog.demo.tools import create_demo_tools_app

pytestmark = [pytest.mark.slow, pytest.mark.security]


@pytest.fixture
def upstream() -> Iterator[ThreadServer]:
    server = ThreadServer(create_demo_tools_app()).start()
    try:
        yield server
    finally:
        server.stop()


def keys(*args: str, database_url: str) -> str:
    done = run("keys", *args, "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_keys_made_by_the_cli_work_persist_across_restarts_and_stop_when_revoked(
    store_url: str, upstream: ThreadServer, tmp_path: Path
) -> None:
    org = f"org-{uuid.uuid4().hex[:12]}"
    admin = new_key()
    config = write_org_config(tmp_path / "undolog.toml", org, admin)

    created = keys("create", "--org", org, "--name", "alice-laptop", "--role", "approver",
                   database_url=store_url)  # fmt: skip
    key_id = re.search(r"key id:\s+(key_[0-9a-f]{12})", created)
    secret = re.search(r"key:\s+(ul_\S+)", created)
    assert key_id and secret, created
    key = secret.group(1)

    servers: list[ProcessServer] = []
    try:
        for _ in range(2):  # a restart re-reads the config: the CLI key is not the config's
            proxy = spawn_proxy(store_url, upstream.url, config)
            servers.append(proxy)
            answer = httpx.get(f"{proxy.url}/approvals", headers={"X-Api-Key": key}, timeout=10)
            assert answer.status_code == 200, answer.text
            refused = httpx.put(
                f"{proxy.url}/tools/x", json={"tier": "safe"}, headers={"X-Api-Key": key}
            )
            assert refused.json()["code"] == "forbidden"  # an approver does not register tools
            proxy.stop()

        listing = keys("list", "--org", org, database_url=store_url)
        assert key not in listing and hash_api_key(key) not in listing
        assert hash_api_key(admin) not in listing
        (row,) = [line for line in listing.splitlines() if key_id.group(1) in line]
        assert row.split()[1:5] == [org, "alice-laptop", "approver", "cli"]
        assert "admin" in listing  # the config's key, listed too

        proxy = spawn_proxy(store_url, upstream.url, config)
        servers.append(proxy)
        with httpx.Client(base_url=proxy.url, headers={"X-Api-Key": key}, timeout=10) as c:
            assert c.get("/sessions").status_code == 200
            assert keys("revoke", key_id.group(1), database_url=store_url).strip() == (
                f"revoked {key_id.group(1)}"
            )
            wait_until(
                lambda: c.get("/sessions").status_code == 403,
                timeout=15.0,
                what="the revoked key to stop working (cache TTL 5 s)",
            )
        after = keys("list", "--org", org, database_url=store_url)
        (row,) = [line for line in after.splitlines() if key_id.group(1) in line]
        assert row.split()[-1] != "-"  # revoked: a time
    finally:
        for server in servers:
            server.stop()


def test_keys_cli_refuses_an_unknown_role_and_an_unknown_key_id(store_url: str) -> None:
    bad_role = run("keys", "create", "--org", "o", "--name", "n", "--role", "root",
                   "--database-url", store_url)  # fmt: skip
    assert bad_role.returncode == 1
    assert "invalid_request" in bad_role.stderr
    unknown = run("keys", "revoke", "key_000000000000", "--database-url", store_url)
    assert unknown.returncode == 1
    assert "not_found" in unknown.stderr
