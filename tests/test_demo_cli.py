"""`undolog demo`, run for real as a child process: on its own, and against a running proxy.

The scripted session sends an email and moves money, retries a step (a replay), waits for an
approval, fails, and is rolled back; the command prints the timeline and exits 0 only if the
session ends `compensated`.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from tests.proxy.conftest import make_settings, role_keys
from tests.support.servers import ThreadServer, undolog_command
from undolog.config import OrgConfig
from undolog.demo.tools import create_demo_tools_app

SESSION = re.compile(r"^session ([0-9a-f-]{36})  state=(\w+)$", re.MULTILINE)
STEP = re.compile(r"^  step (\d+): \S+ +\d{3} (\w+)", re.MULTILINE)


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    return subprocess.run(
        undolog_command("demo", *args),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def table(output: str, title: str) -> list[list[str]]:
    """The rows of the printed table under `title` (header and rule left out)."""
    section = output.split(title, 1)[1].split("\n\n", 1)[0]
    return [line.split() for line in section.strip().splitlines()[2:]]


def assert_rolled_back(output: str) -> str:
    """The timeline printed by the demo ends in a compensated session; its id."""
    steps = STEP.findall(output)
    assert [step for step, _ in steps] == ["1", "2", "3", "3", "4", "5"], output
    assert [outcome for _, outcome in steps] == [
        "executed", "executed", "executed", "replayed", "pending_approval", "executed",
    ]  # fmt: skip
    rollback_at = output.index("rollback: compensated")
    assert output.index("step 5:") < rollback_at < output.index("undo stack (top first):")
    [(session, state)] = SESSION.findall(output)
    assert state == "compensated"
    effects = [(r[0], r[1], r[3]) for r in table(output, "effects (step order):")]
    assert effects == [
        ("2", "send_email", "compensated"),
        ("3", "transfer_funds", "compensated"),
        ("4", "delete_database", "rejected"),  # the rollback withdrew its pending approval
        ("5", "transfer_funds", "committed"),  # it failed logically: nothing to undo
    ]
    undo = [(r[1], r[2]) for r in table(output, "undo stack (top first):")]
    assert undo == [
        ("reverse_transfer", "skipped"),
        ("reverse_transfer", "compensated"),
        ("undo_send_email", "compensated"),
    ]
    return str(session)


def test_the_demo_runs_on_its_own_and_ends_with_a_compensated_session() -> None:
    done = run_demo()

    assert done.returncode == 0, done.stdout + done.stderr
    assert_rolled_back(done.stdout)


@pytest.fixture
def demo_stack(store_url: str) -> Iterator[tuple[str, str, str]]:
    """A demo upstream and a proxy (threads) on the parametrised store: (proxy, key, upstream)."""
    from undolog.proxy import create_app

    key = "ul_test_" + secrets.token_urlsafe(18)
    org = OrgConfig(org_id=f"org-{secrets.token_hex(6)}", keys=role_keys(key))
    upstream = ThreadServer(create_demo_tools_app(inspect=True)).start()
    proxy = ThreadServer(create_app(make_settings(store_url, upstream.url, (org,)))).start()
    try:
        yield proxy.url, key, upstream.url
    finally:
        proxy.stop()
        upstream.stop()


def test_the_demo_against_a_running_proxy_undoes_the_email_and_the_transfer(
    demo_stack: tuple[str, str, str],
) -> None:
    proxy_url, key, upstream_url = demo_stack

    done = run_demo("--url", proxy_url, "--api-key", key)

    assert done.returncode == 0, done.stdout + done.stderr
    session = assert_rolled_back(done.stdout)
    view = httpx.get(f"{proxy_url}/sessions/{session}", headers={"X-Api-Key": key}).json()
    assert view["state"] == "compensated"
    state = httpx.get(f"{upstream_url}/state").json()
    assert [m["status"] for m in state["messages"].values()] == ["recalled"]
    assert state["balances"] == {"ops": 1000, "ada": 1000}
    assert [t["status"] for t in state["transfers"].values()] == ["reversed"]


def test_the_demo_against_a_proxy_with_a_wrong_key_says_so_and_exits_1(
    demo_stack: tuple[str, str, str],
) -> None:
    proxy_url, _, _ = demo_stack

    done = run_demo("--url", proxy_url, "--api-key", "ul_wrong")

    assert done.returncode == 1
    assert f"error: the proxy at {proxy_url} refused: 403" in done.stderr
    assert '"code":"auth_failed"' in done.stderr
    assert "Traceback" not in done.stderr
    assert "rollback" not in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--url", "http://127.0.0.1:9", "--api-key", "k"), "error: cannot reach the proxy at"),
        (("--url", "http://127.0.0.1:9"), "error: --url needs the org's --api-key"),
    ],
    ids=["unreachable", "no-key"],
)
def test_the_demo_against_a_proxy_it_cannot_use_exits_1_with_a_clear_error(
    args: tuple[str, ...], message: str
) -> None:
    done = run_demo(*args)

    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr
