"""The demo tool server's memory: what one org's calls did, and every org's (see `tools.py`).

Kept in process, per org: sent messages, balances, transfers, records, and how many times each
idempotency key called (and really ran) each tool. Tests read it through the server's
inspection routes, or in process through `create_demo_tools_app(state)`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = [
    "CALL_LOG_LIMIT",
    "DEFAULT_BALANCE",
    "NO_IDEMPOTENCY_KEY",
    "Args",
    "DemoToolState",
    "TenantState",
    "ToolFailure",
    "TransportFault",
]

Args = dict[str, Any]

DEFAULT_BALANCE = 1000
"""The balance of an account that nobody has set or touched."""

CALL_LOG_LIMIT = 100_000
"""How many calls `/calls` remembers; older ones drop off so a long benchmark stays bounded."""

NO_IDEMPOTENCY_KEY = "-"
"""The counter key for a call that carries neither an `Idempotency-Key` header nor an effect id."""


class ToolFailure(Exception):
    """A logical failure: answered with `status` and a ToolResult whose `error` is the message."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


class TransportFault(Exception):
    """The tool answers with something that is not a ToolResult (a transport-level failure)."""


class TenantState:
    """What one org's calls did: its own messages, balances, transfers, records, counters.

    Orgs are kept apart as a shared tool server must keep them (every call names its org in a
    signed header: docs/upstreams.md): org B cannot recall org A's message nor reverse A's
    transfer, and one idempotency key of A never answers a call of B. Ids come from a sequence
    shared by all orgs (`ids`), so they are unique on the server and a merged view has no
    clashes.
    """

    def __init__(self, ids: dict[str, int]) -> None:
        self.messages: dict[str, dict[str, Any]] = {}
        self.balances: dict[str, float] = {}
        self.transfers: dict[str, dict[str, Any]] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.deleted_databases: list[str] = []
        self.published_artifacts: list[str] = []
        self.counters: dict[str, dict[str, int]] = {}
        self.executions: dict[str, dict[str, int]] = {}
        self.attempts: dict[tuple[str, str], int] = {}
        self.completed: dict[tuple[str, str], Any] = {}
        self.inflight: dict[tuple[str, str], asyncio.Future[Any]] = {}
        self._ids = ids

    def next_id(self, prefix: str) -> str:
        """The next id of a kind: `msg-1`, `msg-2`, … (deterministic, so tests can predict it)."""
        n = self._ids.get(prefix, 0) + 1
        self._ids[prefix] = n
        return f"{prefix}-{n}"

    def balance(self, account: str) -> float:
        return self.balances.get(account, DEFAULT_BALANCE)

    def fail_first(self, tool: str, key: str, fail_times: int) -> int:
        """Count an attempt of (`tool`, `key`); raise a 500 failure for the first `fail_times`.

        Returns:
            The attempt number (1-based) when it is allowed to succeed.
        """
        attempt = self.attempts.get((tool, key), 0) + 1
        self.attempts[(tool, key)] = attempt
        if attempt <= fail_times:
            raise ToolFailure(500, f"{tool}: injected failure {attempt} of {fail_times}")
        return attempt

    def snapshot(self) -> dict[str, Any]:
        """The effects, as `GET /state?org=…` shows them."""
        return {
            "messages": self.messages,
            "balances": self.balances,
            "transfers": self.transfers,
            "records": self.records,
            "deleted_databases": self.deleted_databases,
            "published_artifacts": self.published_artifacts,
        }


def _merged_counts(parts: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, int]]:
    merged: dict[str, dict[str, int]] = {}
    for part in parts:
        for tool, per_key in part.items():
            into = merged.setdefault(tool, {})
            for key, n in per_key.items():
                into[key] = into.get(key, 0) + n
    return merged


class DemoToolState:
    """Everything the demo tools remember, in memory, per org. Tests may read it in process.

    `tenants[org]` is one org's `TenantState`; the org is the verified `X-UndoLog-Org` of the
    call ("" for a call that names none, which only a server without a secret accepts). The
    read-only attributes (`counters`, `messages`, ...) merge every org, for a test that runs
    one org (or wants the sum); `tenant(org)` gives one org's.

    `counters[tool][idempotency_key]` is how many times that key called that tool, and
    `executions[tool][idempotency_key]` how many times the tool then really ran to success:
    the tools in `IDEMPOTENT_TOOLS` honour the key (a repeated key gets the first answer back,
    waiting for it if it is still running), the others run on every call. `calls` is every
    call in arrival order (the most recent `CALL_LOG_LIMIT`), each with its `org`.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every org's effects, counters and logged calls."""
        self.tenants: dict[str, TenantState] = {}
        self.calls: deque[dict[str, Any]] = deque(maxlen=CALL_LOG_LIMIT)
        self._seq = 0
        self._ids: dict[str, int] = {}

    def tenant(self, org: str) -> TenantState:
        """The org's state, created empty on first use."""
        found = self.tenants.get(org)
        if found is None:
            found = self.tenants[org] = TenantState(self._ids)
        return found

    def record_call(
        self,
        tool: str,
        key: str,
        args: Args,
        *,
        request_id: str | None,
        session_id: str | None,
        effect_id: str | None,
        org: str = "",
    ) -> None:
        """Count one call of `tool` by `org` under idempotency `key`; append it to the log."""
        per_key = self.tenant(org).counters.setdefault(tool, {})
        per_key[key] = per_key.get(key, 0) + 1
        self._seq += 1
        self.calls.append(
            {
                "tool": tool,
                "idempotency_key": key,
                "args": args,
                "seq": self._seq,
                "request_id": request_id,
                "session_id": session_id,
                "effect_id": effect_id,
                "org": org,
            }
        )

    # -- merged views over every org ---------------------------------------------------------

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        return _merged_counts([t.counters for t in self.tenants.values()])

    @property
    def executions(self) -> dict[str, dict[str, int]]:
        return _merged_counts([t.executions for t in self.tenants.values()])

    @property
    def messages(self) -> dict[str, dict[str, Any]]:
        return {k: v for t in self.tenants.values() for k, v in t.messages.items()}

    def snapshot(self) -> dict[str, Any]:
        """Every org's effects in one view (ids are unique server-wide; balances of an account
        two orgs both touched show the last org's)."""
        merged: dict[str, Any] = {
            "messages": {},
            "balances": {},
            "transfers": {},
            "records": {},
            "deleted_databases": [],
            "published_artifacts": [],
        }
        for tenant in self.tenants.values():
            for name, part in tenant.snapshot().items():
                if isinstance(part, dict):
                    merged[name].update(part)
                else:
                    merged[name].extend(part)
        return merged
