"""Fixtures of the framework-integration tests: a real proxy (both stores, from
tests/proxy/conftest.py) and an SDK client on it with the org's admin key (the SDK registers its
tools on first use)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from undolog_sdk import UndoLogClient

demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy


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
