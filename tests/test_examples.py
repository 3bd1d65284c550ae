"""The example agent in `examples/` runs against a real proxy and does what its docstring says."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.sdk.helpers import Agent, decide_approval, session_view

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

pytestmark = pytest.mark.slow

AGENT = Path(__file__).resolve().parents[1] / "examples" / "agent.py"
LANGGRAPH_AGENT = AGENT.with_name("langgraph_agent.py")
OPENAI_AGENT = AGENT.with_name("openai_agents_agent.py")
PYDANTIC_AGENT = AGENT.with_name("pydantic_ai_agent.py")
LLAMA_AGENT = AGENT.with_name("llama_index_agent.py")
SK_AGENT = AGENT.with_name("semantic_kernel_agent.py")


def agent_env(proxy: ProxyHarness, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "UNDOLOG_PROXY_URL": proxy.url,
        "UNDOLOG_API_KEY": proxy.api_key,
        "UNDOLOG_ORG_ID": proxy.org_id,
        **extra,
    }


def run_agent(proxy: ProxyHarness, script: Path = AGENT, **extra: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, str(script)],
        env=agent_env(proxy, **extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


def result_of(lines: list[str], tool: str) -> Any:
    (line,) = [line for line in lines if line.startswith(f"{tool} -> ")]
    return json.loads(line.split(" -> ", 1)[1])


def session_of(lines: list[str]) -> str:
    assert lines[0].startswith("session ")
    return lines[0].split()[1]


def approval_of(lines: list[str]) -> str:
    (line,) = [line for line in lines if " awaits approval " in line]
    return line.split(" awaits approval ")[1].split()[0]


def test_the_example_agent_stops_at_the_approval_and_a_rerun_replays_and_finishes(
    proxy: ProxyHarness,
) -> None:
    code, first = run_agent(proxy)
    assert code == 2, first
    session_id = session_of(first)
    assert "[tool] search_customers runs ('ada')" in first
    assert sum(line.startswith("[tool] charge_card runs") for line in first) == 1
    assert not any(line.startswith("[tool] delete_customer_data") for line in first)
    charge = result_of(first, "charge_card")
    approval_id = approval_of(first)

    view = session_view(proxy, session_id)
    assert [(e["tool_name"], e["state"]) for e in view["effects"]] == [
        ("charge_card", "committed"),
        ("delete_customer_data", "awaiting_approval"),
    ]
    key = view["effects"][0]["effect_id"]
    assert f"[tool] charge_card runs (idempotency key {key})" in first
    assert [u["fn_name"] for u in view["undo_stack"]] == ["refund_charge"]

    asyncio.run(decide_approval(proxy, approval_id))

    code, second = run_agent(proxy, UNDOLOG_SESSION_ID=session_id)
    assert code == 0, second
    assert session_of(second) == session_id
    assert "[tool] search_customers runs ('ada')" in second  # SAFE: runs every time
    assert not any(line.startswith("[tool] charge_card") for line in second)  # replayed
    assert result_of(second, "charge_card") == charge
    assert "[tool] delete_customer_data runs (cus_42)" in second
    assert result_of(second, "delete_customer_data") == {"deleted": "cus_42"}
    effects = session_view(proxy, session_id)["effects"]
    assert [(e["state"], e["attempts"]) for e in effects] == [("committed", 1)] * 2


def test_the_example_agent_can_wait_for_the_approval(proxy_factory: Any, tmp_path: Path) -> None:
    harness: ProxyHarness = proxy_factory(retry_after_seconds=1)
    env = agent_env(harness, AGENT_WAIT="1")
    with Agent([sys.executable, str(AGENT)], env, tmp_path / "agent.log") as agent:
        waiting = agent.wait_for_line(" awaits approval ")
        assert waiting.endswith("ask again in 1s")
        asyncio.run(decide_approval(harness, approval_of(agent.lines)))
        assert agent.finish() == 0, agent.lines
    assert (tmp_path / "agent.log").read_text() == ""
    assert "[tool] delete_customer_data runs (cus_42)" in agent.lines
    assert result_of(agent.lines, "delete_customer_data") == {"deleted": "cus_42"}
    assert sum(line.startswith("[tool] charge_card runs") for line in agent.lines) == 1


def test_the_langgraph_example_interrupts_and_a_restarted_agent_replays_and_finishes(
    proxy: ProxyHarness,
) -> None:
    code, first = run_agent(proxy, LANGGRAPH_AGENT)
    assert code == 2, first
    session_id = session_of(first)
    assert sum(line.startswith("[tool] charge_card runs") for line in first) == 1
    assert not any(line.startswith("[tool] delete_customer_data") for line in first)
    (waiting,) = [line for line in first if " awaits approval " in line]
    assert waiting.startswith("delete_customer_data awaits approval ")
    assert "(step 3); undo plan ['charge_card -> refund_charge']" in waiting

    asyncio.run(decide_approval(proxy, approval_of(first)))

    code, second = run_agent(proxy, LANGGRAPH_AGENT, UNDOLOG_SESSION_ID=session_id)
    assert code == 0, second
    assert "[tool] search_customers runs ('ada')" in second  # SAFE: runs every time
    assert not any(line.startswith("[tool] charge_card") for line in second)  # replayed
    assert "[tool] delete_customer_data runs (cus_42)" in second
    assert result_of(second, "delete_customer_data") == {"deleted": "cus_42"}
    assert result_of(second, "charge_card")["charge_id"] == "ch_1"
    view = session_view(proxy, session_id)
    assert [(e["tool_name"], e["state"], e["attempts"]) for e in view["effects"]] == [
        ("charge_card", "committed", 1), ("delete_customer_data", "committed", 1),
    ]  # fmt: skip
    assert view["state"] == "completed"


def test_the_langgraph_example_can_wait_and_resume_its_graph(
    proxy_factory: Any, tmp_path: Path
) -> None:
    harness: ProxyHarness = proxy_factory(retry_after_seconds=1)
    env = agent_env(harness, AGENT_WAIT="1")
    with Agent([sys.executable, str(LANGGRAPH_AGENT)], env, tmp_path / "agent.log") as agent:
        waiting = agent.wait_for_line(" awaits approval ")
        assert waiting.endswith("ask again in 1s")
        approval_id = waiting.split(" awaits approval ")[1].split()[0]  # it may ask again
        asyncio.run(decide_approval(harness, approval_id))
        assert agent.finish() == 0, agent.lines
    assert (tmp_path / "agent.log").read_text() == ""
    assert sum(line.startswith("[tool] charge_card runs") for line in agent.lines) == 1
    assert sum(line.startswith("[tool] delete_customer_data runs") for line in agent.lines) == 1
    assert result_of(agent.lines, "delete_customer_data") == {"deleted": "cus_42"}


# The framework examples (the same agent in each framework): (script, the module to import,
# whether the agent's answer is the last line it prints).
FRAMEWORK_EXAMPLES = {
    "openai-agents": (OPENAI_AGENT, "agents", False),
    "pydantic-ai": (PYDANTIC_AGENT, "pydantic_ai", False),
    "llama-index": (LLAMA_AGENT, "llama_index.core", True),
    "semantic-kernel": (SK_AGENT, "semantic_kernel", True),
}
ANSWER = "agent -> Charged cus_42 and deleted their data."


@pytest.mark.parametrize("framework", list(FRAMEWORK_EXAMPLES))
def test_a_framework_example_stops_at_its_approval_and_a_restart_finishes(
    proxy: ProxyHarness, framework: str
) -> None:
    script, module, answer_last = FRAMEWORK_EXAMPLES[framework]
    pytest.importorskip(module)
    code, first = run_agent(proxy, script)
    assert code == 2, first
    session_id = session_of(first)
    assert sum(line.startswith("[tool] charge_card runs") for line in first) == 1
    assert not any(line.startswith("[tool] delete_customer_data") for line in first)
    asyncio.run(decide_approval(proxy, approval_of(first)))

    code, second = run_agent(proxy, script, UNDOLOG_SESSION_ID=session_id)
    assert code == 0, second
    assert session_of(second) == session_id
    assert not any(line.startswith("[tool] charge_card") for line in second)  # replayed
    assert "[tool] delete_customer_data runs (cus_42)" in second
    assert ANSWER in second
    if answer_last:
        assert second[-1] == ANSWER
    view = session_view(proxy, session_id)
    assert [(e["tool_name"], e["state"], e["attempts"]) for e in view["effects"]] == [
        ("charge_card", "committed", 1), ("delete_customer_data", "committed", 1),
    ]  # fmt: skip
    assert view["state"] == "completed"


@pytest.mark.parametrize("framework", ["openai-agents", "pydantic-ai", "llama-index"])
def test_a_framework_example_can_wait_and_resume_its_run(
    proxy_factory: Any, tmp_path: Path, framework: str
) -> None:
    script, module, _ = FRAMEWORK_EXAMPLES[framework]
    pytest.importorskip(module)
    harness: ProxyHarness = proxy_factory(retry_after_seconds=1)
    env = agent_env(harness, AGENT_WAIT="1")
    with Agent([sys.executable, str(script)], env, tmp_path / "agent.log") as agent:
        agent.wait_for_line(" awaits approval ")
        asyncio.run(decide_approval(harness, approval_of(agent.lines)))
        assert agent.finish() == 0, agent.lines
    assert (tmp_path / "agent.log").read_text() == ""
    assert agent.lines.count("[tool] delete_customer_data runs (cus_42)") == 1
    assert sum(line.startswith("[tool] charge_card runs") for line in agent.lines) == 1
    assert agent.lines[-1] == ANSWER
