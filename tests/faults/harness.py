"""What every fault test shares: proxies on one store and org, calls, retries, the invariants.

A `Cluster` is one org on one store in front of the counting tool server (`upstream.py`),
with proxy child processes (`python -m undolog serve`) started on demand, some of them armed
with a crash point. A `Call` is one logical call (a session and a step), which keeps every
answer it got. The invariants are computed from evidence that outlives any process: the
execution log the tool server fsyncs, replays served by a clean proxy, and the store's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from tests.faults.upstream import TOOLS, ExecutionLog
from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until
from undolog.faults import CRASH_EXIT_CODE

LEASE_SECONDS = 2
DEADLINE = 60.0
START_TIMEOUT = 90.0
"""A proxy's start-up: seconds on a quiet machine, far more on a busy 2-core one."""
RETRY_PAUSE = 0.05
"""The client's pause between two tries of a call that was not settled: its retry policy."""

IN_DOUBT = "409 effect_in_doubt"
SETTLED = ("200 executed", "200 replayed", IN_DOUBT)
"""The final answers of a tool call: a result, or the documented in-doubt answer."""
TRANSIENT_CODES = frozenset(
    {"in_progress", "tool_error", "commit_failed", "intercept_failed", "database_error"}
)
"""Answers a client retries: the call is running elsewhere, or this try did not settle it."""
TRANSPORT_ERROR = "transport_error"


_ONCE = {"max_retries": 0, "retry_backoff_ms": 10}
_KEYED_UNDO = {"fn_name": "iunwrite", "idempotent": True, **_ONCE}
TOOL_SPECS: dict[str, dict[str, Any]] = {
    # Not idempotent, and neither is its undo.
    "write": {"tier": "compensable", "compensation": {"fn_name": "unwrite", **_ONCE}},
    # Not idempotent; its undo honours the key (the entry id) and says so.
    "kwrite": {"tier": "compensable", "compensation": _KEYED_UNDO},
    # Honours the key and says so: a lost run may be re-run under the same key.
    "iwrite": {
        "tier": "compensable",
        "compensation": _KEYED_UNDO,
        "idempotent_upstream": True,
    },
}
"""The registry entries of the counting tools (see `tests.faults.upstream`). A compensation's
`idempotent` flag (issue 11 point 6) is dropped where the proxy does not know it yet."""


def outcome(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"{response.status_code} not_json"
    status = body.get("status") or body.get("code") if isinstance(body, dict) else None
    return f"{response.status_code} {status}"


@dataclass
class Call:
    """One logical call: its body, and every answer it got (`transport_error` when none)."""

    session_id: str
    step: int
    tool: str
    extra_args: dict[str, Any] = field(default_factory=dict)
    answers: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)

    @property
    def call_id(self) -> str:
        return f"{self.session_id}:{self.step}"

    @property
    def body(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "tool_name": self.tool,
            "step_index": self.step,
            "args": {"call": self.call_id, **self.extra_args},
        }

    @property
    def last(self) -> str | None:
        return self.answers[-1][0] if self.answers else None

    @property
    def settled(self) -> bool:
        return self.last in SETTLED

    def acknowledged(self) -> list[dict[str, Any]]:
        """Every result answer this call's clients received (executed or replayed)."""
        return [b for o, b in self.answers if o in ("200 executed", "200 replayed") and b]

    def note(self, response: httpx.Response | None) -> str:
        if response is None:
            self.answers.append((TRANSPORT_ERROR, None))
            return TRANSPORT_ERROR
        said = outcome(response)
        self.answers.append((said, response.json() if said.split()[1] != "not_json" else None))
        return said


@dataclass
class Cluster:
    """Proxy processes sharing one store and one org, in front of the counting upstream."""

    store_url: str
    upstream_url: str
    config: Path
    org_id: str
    api_key: str
    logs: Path
    log: ExecutionLog
    started: list[ProcessServer] = field(default_factory=list)
    _clean: ProcessServer | None = None

    @property
    def clean(self) -> ProcessServer:
        """The cluster's unarmed proxy, started (and the tools registered) on first use."""
        if self._clean is None or self._clean.proc is None or self._clean.proc.poll() is not None:
            [self._clean] = self.spawn("clean")
            self.register(self._clean, TOOL_SPECS)
        return self._clean

    @property
    def store(self) -> str:
        return "sqlite" if self.store_url.startswith("sqlite") else "postgres"

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Api-Key": self.api_key}

    def spawn(
        self, *names: str, armed: dict[str, str] | None = None, **env: str
    ) -> list[ProcessServer]:
        """Start one proxy per name, at once; `armed` maps a name to its `UNDOLOG_CRASH_POINT`
        (the others are not armed)."""
        env = {"UNDOLOG_LEASE_SECONDS": str(LEASE_SECONDS), **env}

        def start(name: str) -> ProcessServer:
            crash = (armed or {}).get(name)
            port = free_port()
            server = ProcessServer(
                undolog_command("serve"),
                env={
                    "UNDOLOG_DATABASE_URL": self.store_url,
                    "UNDOLOG_UPSTREAM_URL": self.upstream_url,
                    "UNDOLOG_CONFIG": str(self.config),
                    "UNDOLOG_PORT": str(port),
                    "UNDOLOG_LOG_LEVEL": "warning",
                    # Each proxy its own spool (a process recovers its spool at start).
                    "UNDOLOG_SPOOL_DIR": str(self.logs / f"spool-{name}-{port}"),
                    # Storms and retry loops far above a key's call quota: not under test here.
                    "UNDOLOG_KEY_CALLS_PER_SECOND": "100000",
                    "UNDOLOG_KEY_CALL_BURST": "100000",
                    **env,
                    **({"UNDOLOG_CRASH_POINT": crash} if crash else {}),
                },
                port=port,
                log_path=str(self.logs / f"proxy-{name}.log"),
            )
            self.started.append(server)  # at once: stopped at the end even if start fails
            return server.start(timeout=START_TIMEOUT)

        with ThreadPoolExecutor(len(names)) as pool:
            return list(pool.map(start, names))

    @property
    def clean_or_none(self) -> ProcessServer | None:
        return self._clean

    def restart_clean(self) -> ProcessServer:
        """Replace the clean proxy by a fresh process (a start-up after the crash)."""
        if self._clean is not None:
            self._clean.stop()
            self.started.remove(self._clean)
            self._clean = None
        return self.clean

    def register(self, server: ProcessServer, specs: dict[str, dict[str, Any]]) -> None:
        with httpx.Client(base_url=server.url, headers=self.headers, timeout=DEADLINE) as c:
            for name, spec in specs.items():
                response = c.put(f"/tools/{name}", json=spec)
                if response.status_code == 400 and "idempotent" in response.text:
                    undo = {k: v for k, v in spec["compensation"].items() if k != "idempotent"}
                    response = c.put(f"/tools/{name}", json={**spec, "compensation": undo})
                response.raise_for_status()

    def send(self, server: ProcessServer, call: Call, client: httpx.Client | None = None) -> str:
        """One try of `call` on `server`; the outcome, also noted on the call."""
        try:
            if client is not None:
                response = client.post(server.url + "/mcp/tool_call", json=call.body)
            else:
                response = httpx.post(
                    server.url + "/mcp/tool_call", json=call.body, headers=self.headers,
                    timeout=DEADLINE,
                )  # fmt: skip
        except httpx.TransportError:
            return call.note(None)
        return call.note(response)

    def settle(
        self,
        server: ProcessServer,
        call: Call,
        *,
        max_tries: int = 1000,
        client: httpx.Client | None = None,
    ) -> str:
        """Retry `call` on `server` until it has a final answer (or `max_tries` were spent)."""
        deadline = time.monotonic() + DEADLINE
        for _ in range(max_tries):
            said = self.send(server, call, client)
            if said in SETTLED:
                return said
            code = said.split()[-1]
            if code not in TRANSIENT_CODES and said != TRANSPORT_ERROR:
                return said  # a client error: final, and reported by the invariants
            if time.monotonic() > deadline:
                break
            time.sleep(RETRY_PAUSE)
        return said

    def rollback(self, server: ProcessServer, session_id: str) -> str:
        try:
            response = httpx.post(
                f"{server.url}/sessions/{session_id}/rollback", headers=self.headers,
                timeout=DEADLINE,
            )  # fmt: skip
        except httpx.TransportError:
            return TRANSPORT_ERROR
        body = response.json()
        return f"{response.status_code} {body.get('code') or body.get('outcome')}"

    def settle_rollback(self, server: ProcessServer, session_id: str) -> str:
        """Rerun a rollback until no live claim holds it; its final answer."""
        answers: list[str] = []

        def settled() -> bool:
            answers.append(self.rollback(server, session_id))
            return answers[-1] not in ("409 in_progress", TRANSPORT_ERROR)

        wait_until(settled, timeout=DEADLINE, what="the rollback to settle")
        return answers[-1]

    def upstream_inflight(self) -> int:
        answer = httpx.get(self.upstream_url + "/inflight", timeout=DEADLINE).json()
        return int(answer["inflight"])

    def wait_upstream_busy(self) -> None:
        """Wait until the tool server serves a request (the tool started running)."""
        wait_until(lambda: self.upstream_inflight() > 0, timeout=DEADLINE, what="a tool run")

    def wait_upstream_idle(self) -> None:
        """Wait until the tool server serves no request (a tool may outlive its caller)."""
        wait_until(
            lambda: self.upstream_inflight() == 0, timeout=DEADLINE, what="every tool run to end"
        )

    def view(self, server: ProcessServer, session_id: str) -> dict[str, Any]:
        """`GET /sessions/{id}`: the session, its effects and its undo stack."""
        response = httpx.get(
            f"{server.url}/sessions/{session_id}", headers=self.headers, timeout=DEADLINE
        )
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def wait_crash(self, server: ProcessServer) -> int:
        """Wait (with a deadline) for an armed proxy to hit its crash point; its exit code."""
        assert server.proc is not None
        proc = server.proc
        wait_until(lambda: proc.poll() is not None, timeout=DEADLINE, what="the crash point")
        assert proc.returncode == CRASH_EXIT_CODE, proc.returncode
        return proc.returncode

    # -- the invariants --------------------------------------------------------------------

    def duplicates(self, sessions: Iterable[str]) -> int:
        """Executions beyond the first of any logical call or key of these sessions."""
        return self.log.duplicates(TOOLS, sessions=set(sessions))

    def lost(self, server: ProcessServer, calls: Iterable[Call]) -> list[str]:
        """Acknowledged results that a replay does not return, or that the tool never made."""
        problems: list[str] = []
        produced = self.log.results()
        client = httpx.Client(headers=self.headers, timeout=DEADLINE)
        for call in calls:
            acked = call.acknowledged()
            if not acked:
                continue
            probe = Call(call.session_id, call.step, call.tool, call.extra_args)
            said = self.settle(server, probe, client=client)  # a held result may still commit
            replay = probe.answers[-1][1] or {}
            for body in acked:
                if said != "200 replayed" or (body["effect_id"], body["result"]) != (
                    replay.get("effect_id"),
                    replay.get("result"),
                ):
                    problems.append(f"{call.call_id}: acknowledged {body}, replay {said} {replay}")
                elif body["result"]["output"] not in produced.get(body["effect_id"], []):
                    problems.append(f"{call.call_id}: {body} was never produced by the tool")
        client.close()
        return problems

    def stuck(self, sessions: Iterable[str], within: float) -> int:
        """Effects of `sessions` still `executing` (and undo entries still `running`) once
        `within` seconds passed: the lease ran out and a sweeper, if any, had its chance."""
        counts: list[int] = []
        wanted = sorted(set(sessions))

        def none_left() -> bool:
            counts.append(count_unsettled(self.store_url, self.org_id, wanted))
            return counts[-1] == 0

        with contextlib.suppress(TimeoutError):
            wait_until(none_left, timeout=within, what="no effect left executing")
        return counts[-1]


def count_unsettled(store_url: str, org_id: str, sessions: list[str]) -> int:
    """Effects `executing` plus undo entries `running` of these sessions, read from the store."""
    queries = [
        f"SELECT session_id FROM {table} WHERE org_id = {{p}} AND state = '{state}'"
        for table, state in (("effects", "executing"), ("undo_entries", "running"))
    ]
    found: list[str] = []
    if store_url.startswith("sqlite"):
        path = store_url.split("sqlite:///", 1)[1]
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
            for q in queries:
                found += [row[0] for row in db.execute(q.format(p="?"), (org_id,))]
    else:

        async def read() -> list[str]:
            conn = await asyncpg.connect(store_url.split("?", 1)[0], timeout=10)
            try:
                return [r[0] for q in queries for r in await conn.fetch(q.format(p="$1"), org_id)]
            finally:
                await conn.close()

        found = asyncio.run(read())
    return sum(1 for session in found if session in sessions)


def new_session() -> str:
    return str(uuid.uuid4())
