"""An agent killed with kill -9 mid-session, then restarted with the same session id.

The agent is a real process (the script below, written to a temporary directory) that makes
three COMPENSABLE calls through a real proxy. Each tool body appends its step to a counter file
before it returns, so the file shows exactly which bodies ran, and how often.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import Agent, session_view

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

pytestmark = pytest.mark.slow

AGENT = '''
"""Three compensable calls in one session; can pause before a call or hang inside one."""
import asyncio
import json
import os
import sys

from undolog_sdk import (
    CompensationDescriptor, ToolTier, UndoLogClient, UndoLogSession, current_effect_id,
    undolog_tool,
)
from undolog_sdk.errors import EffectInDoubt, InProgress

PAUSE_BEFORE = int(os.environ.get("AGENT_PAUSE_BEFORE", "0"))
HANG_IN = int(os.environ.get("AGENT_HANG_IN", "0"))
client = UndoLogClient()  # UNDOLOG_PROXY_URL, UNDOLOG_API_KEY


def say(*words):
    print(*words, flush=True)


@undolog_tool(
    tier=ToolTier.COMPENSABLE,
    compensation=CompensationDescriptor.new("undo_step"),
    client=client,
)
async def do_step(n: int) -> dict:
    with open(os.environ["AGENT_COUNTS"], "a") as counts:
        counts.write(f"{n}\\n")
    if n == HANG_IN:
        say("inside", n)
        sys.stdin.readline()  # killed here
    return {"step": n, "key": current_effect_id()}


async def call(n, session):
    while True:
        try:
            return await do_step(n, _session=session)
        except InProgress as exc:  # our own earlier run still holds the call
            say("in_progress", n, exc.retry_after)
            await asyncio.sleep(min(exc.retry_after, 0.2))


async def main():
    session = UndoLogSession(
        org_id=os.environ["UNDOLOG_ORG_ID"], session_id=os.environ["AGENT_SESSION_ID"]
    )
    try:
        async with session:
            for n in (1, 2, 3):
                if n == PAUSE_BEFORE:
                    say("paused before", n)
                    sys.stdin.readline()  # killed here
                result = await call(n, session)
                say("done", n, json.dumps(result))
    except EffectInDoubt as exc:
        say("in_doubt", exc.effect_id)
        sys.exit(3)
    finally:
        await client.aclose()


asyncio.run(main())
'''


@pytest.fixture
def agent_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "agent.py").write_text(AGENT, encoding="utf-8")
    return {"AGENT_SESSION_ID": str(uuid.uuid4()), "AGENT_COUNTS": str(tmp_path / "counts")}


def start_agent(
    tmp_path: Path,
    proxy: ProxyHarness,
    agent_env: dict[str, str],
    **extra: str,
) -> Agent:
    env = {
        **os.environ,
        "UNDOLOG_PROXY_URL": proxy.url,
        "UNDOLOG_API_KEY": proxy.api_key,
        "UNDOLOG_ORG_ID": proxy.org_id,
        **agent_env,
        **extra,
    }
    return Agent([sys.executable, str(tmp_path / "agent.py")], env, tmp_path / "agent.log")


def bodies_run(agent_env: dict[str, str]) -> list[int]:
    path = Path(agent_env["AGENT_COUNTS"])
    return [int(n) for n in path.read_text().split()] if path.exists() else []


def done_results(agent: Agent) -> dict[int, Any]:
    results = {}
    for line in agent.lines:
        if line.startswith("done "):
            _, n, payload = line.split(" ", 2)
            results[int(n)] = json.loads(payload)
    return results


def test_an_agent_killed_between_calls_replays_what_it_did_and_runs_only_the_rest(
    tmp_path: Path,
    proxy: ProxyHarness,
    agent_env: dict[str, str],
) -> None:
    with start_agent(tmp_path, proxy, agent_env, AGENT_PAUSE_BEFORE="3") as first:
        first.wait_for_line("paused before 3")
        first.kill9()
        assert bodies_run(agent_env) == [1, 2]
        before = done_results(first)
        effects = session_view(proxy, agent_env["AGENT_SESSION_ID"])["effects"]
        assert [(e["step_index"], e["state"]) for e in effects] == [
            (1, "committed"),
            (2, "committed"),
        ]

    with start_agent(tmp_path, proxy, agent_env) as second:
        assert second.finish() == 0, second.lines
        after = done_results(second)
        assert sorted(after) == [1, 2, 3]
        assert after[1] == before[1] and after[2] == before[2]  # replayed, recorded values
        assert bodies_run(agent_env) == [1, 2, 3]  # each body ran exactly once

    effects = session_view(proxy, agent_env["AGENT_SESSION_ID"])["effects"]
    assert [(e["step_index"], e["state"], e["attempts"], e["replay_count"]) for e in effects] == [
        (1, "committed", 1, 1),
        (2, "committed", 1, 1),
        (3, "committed", 1, 0),
    ]
    assert after[3]["key"] == effects[2]["effect_id"]


def test_an_agent_killed_inside_a_tool_finds_the_call_in_doubt_until_an_operator_resolves_it(
    tmp_path: Path,
    proxy_factory: Any,
    agent_env: dict[str, str],
) -> None:
    # A short lease, so the lost run is noticed within the test.
    harness: ProxyHarness = proxy_factory(lease_seconds=1.0)
    with start_agent(tmp_path, harness, agent_env, AGENT_HANG_IN="3") as first:
        first.wait_for_line("inside 3")
        first.kill9()
        assert bodies_run(agent_env) == [1, 2, 3]

    # The restart replays 1 and 2; call 3 is executing under the dead run's lease, then in
    # doubt: it may or may not have happened, and the SDK will not guess.
    with start_agent(tmp_path, harness, agent_env) as second:
        assert second.finish() == 3, second.lines
        in_doubt = second.lines[-1].split()
        assert in_doubt[0] == "in_doubt"
        assert sorted(done_results(second)) == [1, 2]
        assert bodies_run(agent_env) == [1, 2, 3]

    # An operator checks the downstream system, finds the step happened, and says so.
    with harness.client() as c:
        resolved = c.post(
            f"/effects/{in_doubt[1]}/resolve",
            json={"outcome": "committed", "result": {"step": 3, "key": in_doubt[1]}},
        )
    assert resolved.status_code == 200, resolved.text

    with start_agent(tmp_path, harness, agent_env) as third:
        assert third.finish() == 0, third.lines
        assert done_results(third)[3] == {"step": 3, "key": in_doubt[1]}
        assert bodies_run(agent_env) == [1, 2, 3]  # no body ran again
