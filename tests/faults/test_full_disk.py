"""A full disk under SQLite's default layout: the database and the spool on one small disk.

The test mounts its own small tmpfs (root only; skipped with the reason otherwise), puts the
SQLite database and `--spool-dir` on it, starts calls of a slow tool, and fills the disk while
the tool runs: the commit fails, and so does the spool write. No caller may be told `200` for a
result that is nowhere durable: each call is either answered `200` (committed, or written to the
spool) or `409 effect_in_doubt` with the reason. Once the disk has room again every result is
committed, a retry replays it, and the tool ran once per call.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness, make_settings, new_key, role_keys
from tests.support.servers import ThreadServer, wait_until
from undolog.config import OrgConfig
from undolog.proxy import create_app

pytestmark = pytest.mark.slow

demo_upstream = proxy_fixtures.demo_upstream  # the fixture, used here by name

CALLS = 6
TOOL_CALL = "/mcp/tool_call"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs of the test's own, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; the file."""
    filler = disk / "filler"
    chunk = b"\0" * 4096
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    return filler


def test_a_full_disk_never_answers_200_for_a_result_that_is_nowhere(
    small_disk: Path,
    demo_upstream: ThreadServer,
    fault_report: Callable[..., str],
) -> None:
    """The disk fills while the tool runs, then the proxy dies before it has room again: a
    `200` must survive that (its result committed, or in the spool for the next proxy), and a
    call whose result could not be written down is answered in doubt."""
    org_id, admin, agent = f"org-{uuid.uuid4().hex[:12]}", new_key(), new_key()
    settings = make_settings(
        f"sqlite:///{small_disk / 'undolog.db'}",
        demo_upstream.url,
        (OrgConfig(org_id=org_id, keys=role_keys(admin, agent)),),
        spool_dir=str(small_disk / "spool"),
        commit_retry_attempts=2,
        commit_retry_backoff_ms=10,
        lease_seconds=1.5,
        lease_sweep_seconds=0.2,
    )
    bodies = [
        {"session_id": str(uuid.uuid4()), "tool_name": "slow", "step_index": 1,
         "args": {"seconds": 1.0}}
        for _ in range(CALLS)
    ]  # fmt: skip
    first = ThreadServer(create_app(settings), settings=settings).start()
    proxy = ProxyHarness(first.url, demo_upstream.url, settings.database_url, org_id, admin,
                         settings, server=first, agent_key=agent)  # fmt: skip
    try:
        proxy.register_demo_tools()
        with ThreadPoolExecutor(CALLS) as pool, proxy.client() as c:
            pending = [pool.submit(c.post, TOOL_CALL, json=body) for body in bodies]
            wait_until(lambda: len(proxy.counters("slow")) == CALLS, what="every call to run")
            filler = fill(small_disk)
            answers = [p.result(timeout=60) for p in pending]
    finally:
        first.stop()  # dies holding what it could not commit: its memory is gone
    filler.unlink()
    said = [f"{a.status_code} {a.json().get('status') or a.json().get('code')}" for a in answers]
    assert set(said) <= {"200 executed", "409 effect_in_doubt"}, said
    for answer in answers:
        if answer.status_code == 409:
            assert "spool" in answer.json()["message"]
    later = ThreadServer(create_app(settings), settings=settings).start()
    proxy = ProxyHarness(later.url, demo_upstream.url, settings.database_url, org_id, admin,
                         settings, server=later, agent_key=agent)  # fmt: skip
    try:
        with proxy.client() as c:

            def state(answer: httpx.Response) -> str:
                found = c.get(f"/effects/{answer.json()['effect_id']}").json()
                return str(found.get("state"))

            def settled() -> bool:  # a 200 committed; an in-doubt answer committed or in doubt
                return all(
                    state(a) == "committed" if a.status_code == 200 else
                    state(a) in ("committed", "in_doubt")
                    for a in answers
                )  # fmt: skip

            with contextlib.suppress(TimeoutError):
                wait_until(settled, timeout=20, what="every call to settle")
            final = [state(a) for a in answers]
            replays = [c.post(TOOL_CALL, json=body) for body in bodies]
        counters = proxy.counters("slow")
    finally:
        later.stop()
    lost = sum(
        1
        for answer, replay in zip(answers, replays, strict=True)
        if answer.status_code == 200 and replay.json().get("result") != answer.json()["result"]
    )
    stuck = sum(1 for s in final if s not in ("committed", "in_doubt"))
    duplicates = sum(1 for n in counters.values() if n > 1)
    fault_report(store="sqlite", point="full_disk_then_kill", trials=CALLS,
                 duplicates=duplicates, lost=lost, stuck=stuck)  # fmt: skip
    assert (duplicates, lost, stuck) == (0, 0, 0), (said, final)
    assert len(counters) == CALLS
