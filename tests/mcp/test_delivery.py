"""Retries without steps: a call is a retry only while its answer is owed to the client.

MCP clients number nothing, so the gateway must tell a retry (the client never got the answer:
the call still runs, waits for approval, or its answer was lost) from a deliberate repeat (the
client has the answer and asks again). These tests lose answers for real: the memory server's
process is stopped with SIGSTOP while the call is in flight, the client gives up and hangs up,
and the server is let go again. The upstream's file is the proof of how often it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.conftest import Gateway, gateway_config, serve_gateway
from tests.support.servers import await_until

pytestmark = pytest.mark.slow

CREATE = "memory.create_entities"


def _entity(name: str) -> dict[str, object]:
    return {"name": name, "entityType": "person", "observations": ["met in the delivery test"]}


def _memory_server_pid(memory_file: Path) -> int:
    """The memory server serving `memory_file` (its environment names the file)."""
    wanted = f"MEMORY_FILE_PATH={memory_file}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
    raise LookupError(f"no process serves {memory_file}")


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process is frozen (SIGSTOP) inside the block: a call to it hangs until the end."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _effects(gateway: Gateway, session_id: str) -> list[dict[str, Any]]:
    with gateway.rest() as rest:
        answer = rest.get(f"/sessions/{session_id}")
    return list(answer.json()["effects"]) if answer.status_code == 200 else []


async def _lose_the_answer(gateway: Gateway, session_id: str, era: str, args: Any) -> None:
    """Call, and hang up while the upstream is frozen: the call runs, its answer is lost."""
    started = len(_effects(gateway, session_id))
    pid = await _warm_memory_server(gateway, session_id)

    ready, go = asyncio.Event(), asyncio.Event()

    async def call() -> None:
        async with gateway.client(session_id, era=era) as client:
            await client.list_tools()  # what a client may ask first, asked while all is up
            ready.set()
            await go.wait()
            await client.call_tool(CREATE, args)

    task = asyncio.create_task(call())
    await asyncio.wait_for(ready.wait(), 30)
    with _stopped(pid):
        go.set()
        await await_until(
            lambda: [e["state"] for e in _effects(gateway, session_id)[started:]] == ["executing"],
            what="the call to reach the upstream",
        )
        task.cancel()  # the client gives up: its connection closes
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await await_until(
        lambda: _effects(gateway, session_id)[-1]["state"] == "committed",
        what="the call to finish without its client",
    )


async def _warm_memory_server(gateway: Gateway, session_id: str) -> int:
    """The memory server starts with the first call to it; a read starts it, recording nothing."""
    async with gateway.client(session_id) as client:
        await client.call_tool("memory.read_graph", {})
    return _memory_server_pid(gateway.memory_file)


@pytest.mark.parametrize("gateway_store", ["sqlite", "postgres"], indirect=True)
async def test_a_write_whose_answer_was_lost_is_replayed_on_retry_without_running_again(
    gateway: Gateway, era: str, session_id: str
) -> None:
    args = {"entities": [_entity("ada")]}
    await _lose_the_answer(gateway, session_id, era, args)
    assert gateway.entities() == ["ada"]
    gateway.memory_file.write_text("")  # a second real run would re-create ada

    async with gateway.client(session_id, era=era) as client:
        retry = await client.call_tool(CREATE, args)
    assert not retry.is_error
    assert retry.meta is not None and retry.meta["undolog"]["status"] == "replayed"
    assert retry.meta["undolog"]["step_index"] == 1
    assert gateway.entities() == []  # the retry did not reach the upstream
    assert [e["state"] for e in _effects(gateway, session_id)] == ["committed"]


async def test_the_same_call_after_its_answer_arrived_runs_again_as_the_next_step(
    gateway: Gateway, era: str, session_id: str
) -> None:
    args = {"entities": [_entity("bea")]}
    async with gateway.client(session_id, era=era) as client:
        first = await client.call_tool(CREATE, args)
        gateway.memory_file.write_text("")
        again = await client.call_tool(CREATE, args)
    assert first.meta is not None and again.meta is not None
    assert [first.meta["undolog"]["status"], again.meta["undolog"]["status"]] == [
        "executed",
        "executed",
    ]
    assert [first.meta["undolog"]["step_index"], again.meta["undolog"]["step_index"]] == [1, 2]
    assert gateway.entities() == ["bea"]  # the repeat ran: bea is back
    assert len({e["effect_id"] for e in _effects(gateway, session_id)}) == 2


async def test_once_a_lost_answer_is_replayed_the_next_identical_call_is_new(
    gateway: Gateway, session_id: str
) -> None:
    args = {"entities": [_entity("cy")]}
    await _lose_the_answer(gateway, session_id, "legacy", args)
    async with gateway.client(session_id) as client:
        replayed = await client.call_tool(CREATE, args)
        gateway.memory_file.write_text("")
        repeated = await client.call_tool(CREATE, args)
    assert replayed.meta is not None and repeated.meta is not None
    assert replayed.meta["undolog"]["status"] == "replayed"
    assert (repeated.meta["undolog"]["status"], repeated.meta["undolog"]["step_index"]) == (
        "executed",
        2,
    )
    assert gateway.entities() == ["cy"]


async def test_the_same_call_while_the_first_still_runs_is_told_to_wait(
    gateway: Gateway, session_id: str
) -> None:
    args = {"entities": [_entity("dee")]}
    pid = await _warm_memory_server(gateway, session_id)
    async with gateway.client(session_id) as first_client, gateway.client(session_id) as second:
        with _stopped(pid):
            first = asyncio.create_task(first_client.call_tool(CREATE, args))
            await await_until(
                lambda: [e["state"] for e in _effects(gateway, session_id)] == ["executing"],
                what="the first call to reach the upstream",
            )
            duplicate = await second.call_tool(CREATE, args)
        result = await first
    assert duplicate.is_error and duplicate.meta is not None
    assert duplicate.meta["undolog"]["error"]["code"] == "in_progress"
    assert result.meta is not None and result.meta["undolog"]["status"] == "executed"
    assert gateway.entities() == ["dee"]
    assert len(_effects(gateway, session_id)) == 1


async def test_owed_answers_and_the_step_counter_survive_a_restart(
    tmp_path: Path, session_id: str
) -> None:
    org = {"org_id": f"org-{secrets.token_hex(6)}", "api_key": "ul_" + secrets.token_urlsafe(18)}
    memory = tmp_path / "memory.jsonl"
    database = f"sqlite:///{tmp_path / 'undolog.db'}"
    config = gateway_config(memory)
    lost = {"entities": [_entity("eve")]}
    with serve_gateway(config, database, tmp_path, **org) as before:
        async with before.client(session_id) as client:
            seen = await client.call_tool(CREATE, {"entities": [_entity("fay")]})
        await _lose_the_answer(before, session_id, "legacy", lost)
    assert seen.meta is not None and seen.meta["undolog"]["step_index"] == 1
    memory.write_text("")

    with serve_gateway(config, database, tmp_path, **org) as after:
        async with after.client(session_id) as client:
            retry = await client.call_tool(CREATE, lost)
            new = await client.call_tool(CREATE, {"entities": [_entity("gus")]})
    assert retry.meta is not None and new.meta is not None
    assert (retry.meta["undolog"]["status"], retry.meta["undolog"]["step_index"]) == (
        "replayed",
        2,
    )
    assert (new.meta["undolog"]["status"], new.meta["undolog"]["step_index"]) == ("executed", 3)
    assert after.entities() == ["gus"]  # eve was not created again


async def test_a_session_id_is_one_session_however_it_is_spelled(gateway: Gateway) -> None:
    session = str(uuid.uuid4())
    async with gateway.client(session.upper()) as client:
        first = await client.call_tool(CREATE, {"entities": [_entity("hal")]})
    async with gateway.client(session) as client:
        second = await client.call_tool(CREATE, {"entities": [_entity("ivy")]})
    assert first.meta is not None and second.meta is not None
    assert [first.meta["undolog"]["step_index"], second.meta["undolog"]["step_index"]] == [1, 2]
    assert len(_effects(gateway, session)) == 2
