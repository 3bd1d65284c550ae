"""Concurrent duplicates: one call runs, its duplicates wait (`409 in_progress`) or replay.

A real proxy (uvicorn on a loopback port) sits in front of the demo tool server. The `slow`
tool (COMPENSABLE in the demo catalog) keeps the first call executing long enough for its
duplicates to arrive while it runs. Exactly-once is read from the upstream's own counters,
which count the runs of each idempotency key (the effect id).
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness, spawn_proxy, write_org_config
from tests.support.servers import ThreadServer
from undolog.demo.catalog import DEMO_TOOLS

CALLS = 50
SLOW_SECONDS = 0.5
"""How long the upstream takes: long enough that the duplicates find the first call running."""


def slow_call(session_id: str, step: int = 1) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "tool_name": "slow",
        "step_index": step,
        "args": {"seconds": SLOW_SECONDS},
    }


async def post_all(
    clients: list[httpx.AsyncClient], bodies: list[dict[str, Any]]
) -> list[httpx.Response]:
    """POST every body at once, spreading them over `clients` in turn."""
    return await asyncio.gather(
        *(
            clients[i % len(clients)].post("/mcp/tool_call", json=body)
            for i, body in enumerate(bodies)
        )
    )


def outcome(response: httpx.Response) -> str:
    body = response.json()
    return f"{response.status_code} {body.get('status') or body.get('code')}"


EXPECTED = frozenset({"200 executed", "200 replayed", "409 in_progress"})


def assert_one_execution(responses: list[httpx.Response]) -> dict[str, Any]:
    """Exactly one `executed`; every other answer is `in_progress` or a replay of it.

    Returns the executed answer's body.
    """
    seen = Counter(outcome(r) for r in responses)
    executed = [r.json() for r in responses if outcome(r) == "200 executed"]
    assert len(executed) == 1, f"expected exactly one execution, got {dict(seen)}"
    first: dict[str, Any] = executed[0]
    unexpected = [r.json() for r in responses if outcome(r) not in EXPECTED]
    assert not unexpected, f"{dict(seen)}; first unexpected: {unexpected[0]}"
    assert seen["409 in_progress"] >= 1, f"no duplicate arrived while the call ran: {dict(seen)}"
    for response in responses:
        body = response.json()
        if response.status_code == 200:
            assert body["effect_id"] == first["effect_id"]
            assert body["result"] == first["result"]
            continue
        assert body["effect_id"] == first["effect_id"]
        assert isinstance(body["retry_after"], int) and body["retry_after"] >= 1, body
        assert response.headers["Retry-After"] == str(body["retry_after"])
        assert response.headers["X-Request-Id"] == body["request_id"]
    return first


async def test_concurrent_identical_calls_run_the_tool_once_and_the_rest_wait_or_replay(
    proxy: ProxyHarness,
) -> None:
    session_id = str(uuid.uuid4())
    async with proxy.async_client() as client:
        responses = await post_all([client], [slow_call(session_id)] * CALLS)
        first = assert_one_execution(responses)
        assert first["result"] == {
            "success": True,
            "output": {"slept": SLOW_SECONDS},
            "error": None,
        }
        assert proxy.counters("slow") == {first["effect_id"]: 1}

        retry = await client.post("/mcp/tool_call", json=slow_call(session_id))
    assert retry.status_code == 200
    assert retry.json() == {
        "status": "replayed",
        "effect_id": first["effect_id"],
        "result": first["result"],
    }
    assert proxy.counters("slow") == {first["effect_id"]: 1}


async def test_concurrent_calls_of_different_sessions_each_run_once(proxy: ProxyHarness) -> None:
    sessions = [str(uuid.uuid4()) for _ in range(CALLS)]
    async with proxy.async_client() as client:
        responses = await post_all([client], [slow_call(s) for s in sessions])
        assert Counter(outcome(r) for r in responses) == {"200 executed": CALLS}
        effect_ids = [r.json()["effect_id"] for r in responses]
        assert len(set(effect_ids)) == CALLS
        assert proxy.counters("slow") == dict.fromkeys(effect_ids, 1)

        replays = await post_all([client], [slow_call(s) for s in sessions])
    assert [(outcome(r), r.json()["effect_id"]) for r in replays] == [
        ("200 replayed", e) for e in effect_ids
    ]
    assert proxy.counters("slow") == dict.fromkeys(effect_ids, 1)


@pytest.mark.postgres
@pytest.mark.slow
async def test_concurrent_identical_calls_split_across_two_proxy_processes_run_once(
    pg_url: str, demo_upstream: ThreadServer, tmp_path: Path
) -> None:
    org_id, api_key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
    config = write_org_config(tmp_path / "undolog.toml", org_id, api_key)
    session_id = str(uuid.uuid4())
    with ExitStack() as stack:
        clients = []
        for name in ("a", "b"):
            server = spawn_proxy(
                pg_url, demo_upstream.url, config, log_path=tmp_path / f"proxy-{name}.log"
            )
            stack.callback(server.stop)
            clients.append(
                httpx.AsyncClient(
                    base_url=server.url,
                    headers={"X-Api-Key": api_key},
                    timeout=30,
                    limits=httpx.Limits(max_connections=CALLS),
                )
            )
        async with clients[0] as a, clients[1] as b:
            for name, spec in DEMO_TOOLS.items():  # registered once, through one process
                (await a.put(f"/tools/{name}", json=spec)).raise_for_status()

            responses = await post_all([a, b], [slow_call(session_id)] * CALLS)
            first = assert_one_execution(responses)
            async with httpx.AsyncClient(base_url=demo_upstream.url) as upstream:
                counters = (await upstream.get("/counters/slow")).json()
            assert counters == {first["effect_id"]: 1}
            for client in (a, b):
                retry = await client.post("/mcp/tool_call", json=slow_call(session_id))
                assert outcome(retry) == "200 replayed"
                assert retry.json()["effect_id"] == first["effect_id"]
