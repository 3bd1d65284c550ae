"""Fixtures of the framework-integration tests: a real proxy (both stores, from
tests/proxy/conftest.py) and an SDK client on it with the org's admin key (the SDK registers its
tools on first use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from undolog_sdk import UndoLogClient

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def client(proxy: ProxyHarness) -> AsyncIterator[UndoLogClient]:
    sdk_client = UndoLogClient(proxy.url, api_key=proxy.api_key)
    try:
        yield sdk_client
    finally:
        await sdk_client.aclose()


def approve(proxy: ProxyHarness, approval_id: str, verb: str = "approve") -> None:
    """Decide an approval as a person would, with the org's approver key."""
    with proxy.client(proxy.approver_key) as c:
        decided = c.post(f"/approvals/{approval_id}/{verb}", json={})
    assert decided.status_code == 200, decided.text


class Restarts:
    """The booking agent of `tests/integrations/restart_agent.py`, each phase in a new
    process: only the state file the framework saved, and the session id, carry over."""

    def __init__(self, proxy: ProxyHarness, framework: str, tmp_path: Path) -> None:
        self.proxy = proxy
        self.framework = framework
        self.log_path = tmp_path / "ran.log"
        self.config = {
            "url": proxy.url,
            "api_key": proxy.api_key,
            "org_id": proxy.org_id,
            "session_id": str(uuid.uuid4()),
            "state": str(tmp_path / "state.json"),
            "log": str(self.log_path),
        }

    @property
    def session_id(self) -> str:
        return self.config["session_id"]

    def __call__(self, phase: str) -> dict[str, Any]:
        """Run one phase in a new interpreter; what it printed."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        )
        done = subprocess.run(
            [sys.executable, "-m", "tests.integrations.restart_agent", self.framework, phase,
             json.dumps(self.config)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        printed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return printed

    def ran(self) -> list[str]:
        """Every tool body that ran, in every process, in order."""
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []
