"""The TCP forwarder the outage test relies on: it forwards, cuts, refuses, and restores."""

from __future__ import annotations

from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.support.forwarder import forwarding

pytestmark = pytest.mark.postgres


async def test_a_cut_drops_open_connections_and_refuses_new_ones_until_restored(
    pg_url: str,
) -> None:
    target = urlsplit(pg_url)
    with forwarding(target.hostname or "127.0.0.1", target.port or 5432) as forwarder:
        url = pg_url.replace(target.netloc.rsplit("@", 1)[-1], forwarder.address)
        conn = await asyncpg.connect(url, timeout=10)
        assert await conn.fetchval("SELECT 1") == 1
        assert forwarder.open_connections == 1

        forwarder.cut()
        with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)):
            await conn.fetchval("SELECT 2")
        with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError)):
            await asyncpg.connect(url, timeout=10)
        assert forwarder.refused == 1

        forwarder.restore()
        again = await asyncpg.connect(url, timeout=10)
        try:
            assert await again.fetchval("SELECT 3") == 3
        finally:
            await again.close()
        assert forwarder.accepted == 2
