"""`undolog audit export|verify|head` over the records of a real proxy, on both stores.

A proxy in front of the demo tool server records calls, an approval decided by the approver
key, a rollback whose compensation gives up and an operator's resolution; the CLI (a child
process, on the proxy's database) exports them as hash-chained JSON Lines, and `verify`
finds every edited, removed, swapped, inserted or cut line (docs/audit.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_rollback import EMAIL, RECORD, TRANSFER, call, new_session, on_store, register
from tests.support.servers import undolog_command
from undolog.engine.audit import GENESIS
from undolog.engine.model import now_us
from undolog.engine.retention import DAY_US, Retention
from undolog.store import open_store


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")}
    return subprocess.run(
        undolog_command("audit", *args),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def export(proxy: ProxyHarness, path: Path, *extra: str) -> dict[str, str]:
    """Export the proxy's org to `path`; the summary lines (`head`, `chained on`)."""
    done = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--output", str(path), *extra,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    return summary


def verify(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return audit("verify", str(path), *extra)


def records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_text().splitlines()]


def activity(proxy: ProxyHarness) -> None:
    """Calls, an approved irreversible call, a rollback whose compensation gives up, and the
    admin's resolution of it."""
    first, second = new_session(), new_session()
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as approver:
        call(agent, first, "send_email", EMAIL, 1)
        call(agent, first, "transfer_funds", TRANSFER, 2)
        waiting = call(agent, first, "publish_to_production", {"version": "1.2"}, 3)
        approval = waiting.json()["approval_id"]
        decided = approver.post(f"/approvals/{approval}/approve", json={"reason": "ok"})
        assert decided.status_code == 200, decided.text
    with proxy.client() as admin:
        register(admin, "create_record", "delete_record", args={"fail_times": 9}, max_retries=0)
        call(admin, second, "create_record", RECORD, 1)
        failed = admin.post(f"/sessions/{second}/rollback")
        assert failed.status_code == 502, failed.text
        entry = failed.json()["next_entry"]["entry_id"]
        resolved = admin.post(f"/undo/{entry}/resolve", json={"note": "deleted by hand"})
        assert resolved.status_code == 200, resolved.text


def test_an_export_of_a_real_server_s_records_verifies(proxy: ProxyHarness, tmp_path: Path) -> None:
    activity(proxy)
    path = tmp_path / "audit.jsonl"
    summary = export(proxy, path)
    checked = verify(path, "--head", summary["head"])
    stored = audit("head", "--org", proxy.org_id, "--database-url", proxy.database_url)

    assert checked.returncode == 0, checked.stderr
    written = records(path)
    assert checked.stdout.strip() == f"{path}: OK, {len(written)} records, head {summary['head']}"
    assert summary["chained on"] == GENESIS == written[0]["prev"]
    assert written[-1]["hash"] == summary["head"]
    assert summary["head"] in stored.stdout and f"{len(written)} records" in stored.stdout
    assert [r["n"] for r in written] == list(range(1, len(written) + 1))
    assert all(r["org_id"] == proxy.org_id for r in written)
    types = [r["type"] for r in written]
    wanted = {"effect_intercepted", "effect_committed", "approval_required",
              "approval_approved", "compensation_failed", "compensation_resolved"}  # fmt: skip
    assert wanted <= set(types)
    [approved] = [r for r in written if r["type"] == "approval_approved"]
    assert (approved["data"]["decided_by"], approved["data"]["reason"]) == ("key:approver", "ok")
    assert approved["call"]["tool_name"] == "publish_to_production"
    [resolved] = [r for r in written if r["type"] == "compensation_resolved"]
    assert resolved["data"]["note"] == "resolved by key:admin: deleted by hand"
    sent = next(r for r in written if r["call"] and r["call"]["tool_name"] == "send_email")
    args = on_store(proxy, lambda q: q.get_effect(proxy.org_id, sent["effect_id"]), write=False)
    assert args is not None
    assert sent["call"]["args_sha256"] == hashlib.sha256(args.args_json.encode()).hexdigest()


def _tampered(lines: list[str], how: str) -> tuple[list[str], int]:
    """`lines` changed one way; the line `verify` must name."""
    changed = list(lines)
    if how == "edit":
        record = orjson.loads(changed[3])
        record["data"]["decided_by"] = "key:someone-else"
        changed[3] = orjson.dumps(record).decode()
        return changed, 4
    if how == "edit-and-rehash":  # a forger who recomputes the edited line's own hash
        from undolog.engine.audit import record_hash

        record = orjson.loads(changed[3])
        record["type"] = "approval_rejected"
        record["hash"] = record_hash(record)
        changed[3] = orjson.dumps(record).decode()
        return changed, 5
    if how == "delete":
        del changed[2]
        return changed, 3
    if how == "delete-first":
        del changed[0]
        return changed, 1
    if how == "swap":
        changed[4], changed[5] = changed[5], changed[4]
        return changed, 5
    if how == "insert":
        changed.insert(6, changed[2])
        return changed, 7
    if how == "truncate":
        return changed[:-2], len(changed) - 1
    if how == "cut-mid-line":
        changed[-1] = changed[-1][:40]
        return changed, len(changed)
    raise AssertionError(how)


TAMPERS = ["edit", "edit-and-rehash", "delete", "delete-first", "swap", "insert", "truncate",
           "cut-mid-line"]  # fmt: skip


@pytest.mark.security
def test_every_kind_of_tampering_is_found_with_its_line(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    path = tmp_path / "audit.jsonl"
    head = export(proxy, path)["head"]
    lines = path.read_text().splitlines()
    assert len(lines) > 8

    found = {}
    for how in TAMPERS:
        changed, line = _tampered(lines, how)
        bad = tmp_path / f"{how}.jsonl"
        bad.write_text("\n".join(changed) + "\n")
        result = verify(bad, "--head", head)
        found[how] = (result.returncode, result.stderr.split(": ")[1] if result.stderr else "")
        assert found[how] == (1, f"line {line}"), (how, result.stderr)


def test_the_next_export_chains_on_the_last_head(proxy: ProxyHarness, tmp_path: Path) -> None:
    activity(proxy)
    first, second, third = (tmp_path / f"{n}.jsonl" for n in ("first", "second", "third"))
    head1 = export(proxy, first)["head"]
    with proxy.client(proxy.agent_key) as agent:
        call(agent, new_session(), "send_email", EMAIL, 1)
    summary = export(proxy, second)
    nothing_new = export(proxy, third)
    both = tmp_path / "both.jsonl"
    both.write_text(first.read_text() + second.read_text())

    assert summary["chained on"] == head1
    assert records(second)[0]["n"] == len(records(first)) + 1
    assert verify(second, "--prev", head1, "--head", summary["head"]).returncode == 0
    alone = verify(second)  # without --prev: it does not start at the genesis
    assert (alone.returncode, alone.stderr.split(": ")[1]) == (1, "line 1")
    assert verify(both, "--head", summary["head"]).returncode == 0
    assert (third.read_text(), nothing_new["head"]) == ("", summary["head"])


@pytest.mark.security
def test_a_rebuilt_chain_finds_history_changed_after_its_export(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    export(proxy, tmp_path / "audit.jsonl")
    rebuilt = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--since", "1970-01-01T00:00:00Z", "--output", str(tmp_path / "again.jsonl"),
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "audit.jsonl").read_text()

    async def rewrite(q: Any) -> None:
        [event] = [e for e in await q.list_events(proxy.org_id) if e.type == "approval_approved"]
        changed = orjson.loads(event.payload_json) | {"decided_by": "key:nobody"}
        await q._execute(
            "UPDATE events SET payload = ? WHERE event_id = ?",
            orjson.dumps(changed).decode(),
            event.event_id,
        )

    on_store(proxy, rewrite, write=True)
    caught = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--since", "1970-01-01", "--output", str(tmp_path / "forged.jsonl"),
    )  # fmt: skip
    assert caught.returncode == 1
    assert "no longer matches the stored head" in caught.stderr


def test_an_unknown_org_is_refused(proxy: ProxyHarness, tmp_path: Path) -> None:
    done = audit(
        "export", "--org", "no-such-org", "--database-url", proxy.database_url,
        "--output", str(tmp_path / "x.jsonl"),
    )  # fmt: skip
    assert done.returncode == 1
    assert "not_found" in done.stderr


# --- issue 22: an anchor outside the database, gaps, and re-checking from the start ---------


def _sql(proxy: ProxyHarness, sql: str, *args: Any) -> None:
    async def run(q: Any) -> None:
        await q._execute(sql, *args)

    on_store(proxy, run, write=True)


def _event_ids(proxy: ProxyHarness) -> list[int]:
    found = on_store(proxy, lambda q: q.list_events(proxy.org_id), write=False)
    return [e.event_id for e in found]


def _rewrite_approval(proxy: ProxyHarness) -> None:
    """A database writer changes who approved the irreversible call."""

    async def rewrite(q: Any) -> None:
        [event] = [e for e in await q.list_events(proxy.org_id) if e.type == "approval_approved"]
        changed = orjson.loads(event.payload_json) | {"decided_by": "key:nobody"}
        await q._execute(
            "UPDATE events SET payload = ? WHERE event_id = ?",
            orjson.dumps(changed).decode(),
            event.event_id,
        )

    on_store(proxy, rewrite, write=True)


@pytest.mark.security
def test_a_history_rewritten_after_the_head_row_is_deleted_fails_against_the_kept_anchor(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    anchors = tmp_path / "anchors.txt"
    summary = export(proxy, tmp_path / "audit.jsonl", "--anchor-file", str(anchors))
    [kept] = anchors.read_text().splitlines()
    assert kept.split()[:2] == [proxy.org_id, summary["anchor"]]
    assert summary["anchor"] == f"{len(records(tmp_path / 'audit.jsonl'))}:{summary['head']}"

    _rewrite_approval(proxy)
    _sql(proxy, "DELETE FROM audit_heads WHERE org_id = ?", proxy.org_id)
    # What was measured: a fresh export of the rewritten history verifies on its own...
    forged = tmp_path / "forged.jsonl"
    export(proxy, forged)
    assert verify(forged).returncode == 0
    # ...but not against the anchor the operator kept, nor does the database.
    for checked in (
        verify(forged, "--anchor-file", str(anchors)),
        verify(forged, "--head", summary["anchor"]),
        audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url,
              "--anchor-file", str(anchors)),
    ):  # fmt: skip
        assert checked.returncode == 1, checked.stdout
        assert "does not match the anchor" in checked.stderr or "no longer matches" in (
            checked.stderr
        )
    again = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--output", str(tmp_path / "again.jsonl"), "--anchor-file", str(anchors),
    )  # fmt: skip
    assert again.returncode == 1
    assert f"no longer matches the anchor {summary['anchor']}" in again.stderr
    assert len(anchors.read_text().splitlines()) == 1  # nothing appended


@pytest.mark.security
def test_an_event_deleted_before_any_export_is_a_gap_with_its_range(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    ids = _event_ids(proxy)
    middle = ids[4]
    _sql(proxy, "DELETE FROM events WHERE event_id IN (?, ?)", middle, ids[5])
    caught = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--output", str(tmp_path / "audit.jsonl"),
    )  # fmt: skip
    assert caught.returncode == 1
    assert "events 5..6 are missing from the database" in caught.stderr
    checked = audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url)
    assert checked.returncode == 1
    assert "record 5: events 5..6 are missing" in checked.stderr


@pytest.mark.security
def test_an_event_deleted_off_the_end_is_found_against_the_counter(proxy: ProxyHarness) -> None:
    activity(proxy)
    ids = _event_ids(proxy)
    _sql(proxy, "DELETE FROM events WHERE event_id = ?", ids[-1])
    checked = audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url)
    assert checked.returncode == 1
    assert f"events {len(ids)} are missing" in checked.stderr


@pytest.mark.security
def test_an_incremental_export_rechecks_rows_already_exported(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    export(proxy, tmp_path / "first.jsonl")
    with proxy.client(proxy.agent_key) as agent:
        call(agent, new_session(), "send_email", EMAIL, 1)
    _rewrite_approval(proxy)  # a row the first export already wrote
    caught = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--output", str(tmp_path / "second.jsonl"),
    )  # fmt: skip
    assert caught.returncode == 1
    assert "no longer matches the stored head" in caught.stderr
    checked = audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url)
    assert checked.returncode == 1
    assert "no longer matches the stored head" in checked.stderr


def test_the_database_chain_verifies_against_its_anchors(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    activity(proxy)
    anchors = tmp_path / "anchors.txt"
    first = export(proxy, tmp_path / "first.jsonl", "--anchor-file", str(anchors))
    with proxy.client(proxy.agent_key) as agent:
        call(agent, new_session(), "send_email", EMAIL, 1)
    second = export(proxy, tmp_path / "second.jsonl", "--anchor-file", str(anchors))
    checked = audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url,
                    "--anchor-file", str(anchors))  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert (
        checked.stdout.strip() == f"org {proxy.org_id}: OK, {second['anchor'].split(':')[0]} "
        f"records, head {second['anchor']}"
    )
    both = verify(tmp_path / "first.jsonl", tmp_path / "second.jsonl",
                  "--anchor-file", str(anchors), "--head", second["anchor"])  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert first["anchor"] != second["anchor"]


def test_an_org_that_prunes_exports_and_verifies_with_the_pruned_counted(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    """Retention deletes events with a mark each (migration 25): the CLI's next export and
    the database check go on through them, counting them (issue 22, point 7)."""
    sessions = [new_session(), new_session()]
    with proxy.client(proxy.agent_key) as agent:
        for session in sessions:
            call(agent, session, "send_email", EMAIL, 1)
            assert agent.post(f"/sessions/{session}/complete").status_code == 200
    anchors = tmp_path / "anchors.txt"
    first = export(proxy, tmp_path / "first.jsonl", "--anchor-file", str(anchors))
    exported = len(records(tmp_path / "first.jsonl"))

    async def prune() -> int:
        store = await open_store(proxy.database_url)
        try:
            later = now_us() + 2 * DAY_US
            counts = await Retention(store, clock_us=lambda: later).prune_org(proxy.org_id, 1)
        finally:
            await store.close()
        return counts.events

    pruned = asyncio.run(prune())
    with proxy.client(proxy.agent_key) as agent:
        call(agent, new_session(), "send_email", EMAIL, 1)
    done = audit(
        "export", "--org", proxy.org_id, "--database-url", proxy.database_url,
        "--output", str(tmp_path / "second.jsonl"), "--anchor-file", str(anchors),
    )  # fmt: skip
    checked = audit("verify", "--org", proxy.org_id, "--database-url", proxy.database_url,
                    "--anchor-file", str(anchors))  # fmt: skip
    files = verify(tmp_path / "first.jsonl", tmp_path / "second.jsonl",
                   "--anchor-file", str(anchors))  # fmt: skip

    assert pruned == exported  # every event of the two finished sessions
    count = exported + len(records(tmp_path / "second.jsonl"))
    what = f"{pruned} events pruned by retention"
    assert done.returncode == 0, done.stderr
    assert f"({count} in the chain, {what})" in done.stdout
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith(f"org {proxy.org_id}: OK, {count} records ({what}), head")
    assert files.returncode == 0, files.stderr  # the kept files hold the pruned records
    assert first["anchor"] in anchors.read_text()
