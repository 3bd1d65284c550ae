"""The operator CLI on rollbacks: `undolog sessions show|rollback`, `undolog undo retry|resolve`.

Split from test_rollback.py, whose helpers it shares.
"""

from __future__ import annotations

import os
import subprocess

import orjson

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_rollback import (
    EMAIL,
    TRANSFER,
    call,
    cli,
    compensation_calls,
    entry_of,
    escalated,
    executions,
    new_session,
    register,
    three_writes,
    view,
)
from tests.support.servers import free_port, undolog_command

# -- the operator CLI ----------------------------------------------------------------------------


def test_the_cli_shows_and_rolls_back_a_session(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        three_writes(client, session)

    listed = cli(proxy, "sessions", "list")
    shown = cli(proxy, "sessions", "show", session)
    rolled = cli(proxy, "sessions", "rollback", session)
    again = cli(proxy, "sessions", "rollback", session, "--json")

    assert listed.returncode == 0, listed.stderr
    assert session in listed.stdout and "active" in listed.stdout
    assert shown.returncode == 0, shown.stderr
    assert f"session {session}  state=active" in shown.stdout
    for tool in ("send_email", "transfer_funds", "create_record", "undo_send_email"):
        assert tool in shown.stdout
    assert rolled.returncode == 0, rolled.stderr
    assert "rollback: compensated" in rolled.stdout
    assert f"session {session}  state=compensated" in rolled.stdout
    assert rolled.stdout.count("compensated") >= 7  # the session, 3 effects, 3 entries
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout)["outcome"] == "compensated"
    assert len(compensation_calls(proxy, session)) == 3


def test_the_cli_rollback_exits_1_when_a_compensation_gives_up(proxy: ProxyHarness) -> None:
    session = new_session()
    with proxy.client() as client:
        register(client, "transfer_funds", "reverse_transfer", args={"fail_times": 1000},
                 max_retries=1)  # fmt: skip
        call(client, session, "transfer_funds", TRANSFER, 1)

    rolled = cli(proxy, "sessions", "rollback", session)
    unknown = cli(proxy, "sessions", "show", new_session())

    assert rolled.returncode == 1, rolled.stdout + rolled.stderr
    assert "rollback: compensation_failed" in rolled.stdout
    assert "Compensation 'reverse_transfer' failed after 1 retries" in rolled.stdout
    assert unknown.returncode == 1
    assert "not_found" in unknown.stderr


def test_the_cli_retries_and_resolves_failed_entries_so_the_rollback_finishes(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client() as client:
        # The email's undo fails 2 times per key with 1 retry: an operator retry then works.
        register(client, "send_email", "undo_send_email", args={"fail_times": 2}, max_retries=1)
        email = call(client, session, "send_email", EMAIL, 1).json()["effect_id"]
        transfer = escalated(proxy, client, session)[1]
        transfer_entry = entry_of(view(client, session), transfer)["entry_id"]

    resolved = cli(proxy, "undo", "resolve", transfer_entry, "--note", "reversed in the bank UI")
    assert resolved.returncode == 0, resolved.stderr
    assert f"entry {transfer_entry} is resolved" in resolved.stdout
    failing = cli(proxy, "sessions", "rollback", session)
    assert failing.returncode == 1
    with proxy.client() as client:
        email_entry = entry_of(view(client, session), email)["entry_id"]
    retried = cli(proxy, "undo", "retry", email_entry)
    assert retried.returncode == 0, retried.stderr
    assert f"entry {email_entry} is pending" in retried.stdout
    finished = cli(proxy, "sessions", "rollback", session)
    twice = cli(proxy, "undo", "retry", email_entry)

    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "rollback: compensated" in finished.stdout
    assert twice.returncode == 1 and "invalid_state_transition" in twice.stderr
    with proxy.client() as client:
        data = view(client, session)
    assert (entry_of(data, transfer)["state"], entry_of(data, transfer)["last_error"]) == (
        "resolved",
        "resolved by key:admin: reversed in the bank UI",
    )
    assert entry_of(data, email)["state"] == "compensated"
    assert proxy.counters("undo_send_email") == {email_entry: 3}
    assert executions(proxy, "undo_send_email") == {email_entry: 1}


def test_the_cli_without_an_api_key_or_a_reachable_proxy_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    closed = f"http://127.0.0.1:{free_port()}"
    no_key = subprocess.run(
        undolog_command("sessions", "list", "--url", closed),
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    unreachable = subprocess.run(
        undolog_command("undo", "retry", "e-1", "--url", closed, "--api-key", "k"),
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (no_key.returncode, unreachable.returncode) == (2, 2)
    assert "API key" in no_key.stderr
    assert "cannot reach the proxy" in unreachable.stderr
