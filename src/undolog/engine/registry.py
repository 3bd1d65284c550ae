"""Orgs, their API keys and their registered tools: what every intercept reads first.

Both are cached briefly per process (`tool_cache_seconds`), so the hot path reads the store
for them at most once per interval; a change made through this process is seen at once, one
made through another process within the interval.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from undolog.engine.keys import KeySource, Role, new_key_id
from undolog.engine.model import now_us
from undolog.engine.rules import Rule, parse_rules, rules_json
from undolog.store.protocol import Queries, Store
from undolog.store.records import KeyRecord, OrgRecord, PolicyRecord, ToolRecord
from undolog.upstreams import check_tool_name
from undolog_sdk.errors import InvalidRequest, ToolNotRegistered
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import CompensationDescriptor, ToolTier

__all__ = ["DEFAULT_APPROVAL_TIMEOUT_S", "Registry"]

DEFAULT_APPROVAL_TIMEOUT_S = 3600


class Registry:
    """The org and tool registry over a `Store`; the `Engine` is one."""

    def __init__(
        self,
        store: Store,
        *,
        tool_cache_seconds: float = 2.0,
        clock_us: Callable[[], int] = now_us,
    ) -> None:
        self.store = store
        self._tool_cache_us = int(tool_cache_seconds * 1_000_000)
        self._tools: dict[tuple[str, str], tuple[int, ToolRecord]] = {}
        self._orgs: dict[str, tuple[int, OrgRecord | None]] = {}
        self._rules: dict[str, tuple[int, tuple[Rule, ...]]] = {}
        self._clock = clock_us

    # -- orgs and keys ---------------------------------------------------------------------

    async def ensure_org(
        self,
        org_id: str,
        *,
        name: str | None = None,
        approval_timeout_s: int = DEFAULT_APPROVAL_TIMEOUT_S,
        auto_approve_on_timeout: bool = False,
        api_key_hashes: tuple[str, ...] = (),
        retention_days: int | None = None,
    ) -> None:
        """Create or update an org and add API keys (given as SHA-256 hex) to it, as
        config-sourced `agent` keys (the proxy's start-up uses `Keys.sync_config`)."""
        now = self._clock()
        async with self.store.transaction() as q:
            await q.upsert_org(
                org_id,
                name or org_id,
                approval_timeout_s,
                auto_approve_on_timeout,
                now,
                retention_days,
            )
            for key_hash in api_key_hashes:
                await q.put_api_key(
                    KeyRecord(new_key_id(), key_hash, org_id, f"{org_id}-legacy-{key_hash[:8]}",
                              Role.AGENT.value, KeySource.CONFIG.value, now, None, None)
                )  # fmt: skip
        self._orgs.pop(org_id, None)

    async def _org(self, q: Queries, org_id: str) -> OrgRecord | None:
        """The org (cached briefly), read through `q`: the caller's own transaction.

        Reading through a second connection while a transaction holds one would deadlock a
        pool of one (or a pool exhausted by transactions that all wait for this read).
        """
        now = self._clock()
        cached = self._orgs.get(org_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        org = await q.get_org(org_id)
        self._orgs[org_id] = (now + self._tool_cache_us, org)
        return org

    # -- tool registry -----------------------------------------------------------------------

    async def register_tool(
        self,
        org_id: str,
        name: str,
        *,
        tier: str,
        version: str = "1.0.0",
        compensation: dict[str, Any] | None = None,
        idempotent_upstream: bool = False,
        upstream: str | None = None,
    ) -> ToolRecord:
        """Register (or replace) a tool for an org.

        `upstream` names the configured tool server that runs it (None: `default`); which
        names an org may pick is the caller's check (`undolog.upstreams.UpstreamRegistry`).

        Raises:
            InvalidRequest: a name outside the tool-name charset, an unknown tier, a
                COMPENSABLE tool without a compensation, or a malformed compensation.
        """
        name_problem = check_tool_name(name)
        if name_problem:
            raise InvalidRequest(name_problem)
        try:
            tool_tier = ToolTier(tier)
        except ValueError:
            raise InvalidRequest(
                f"unknown tier {tier!r}: expected one of safe, compensable, irreversible"
            ) from None
        compensation_json = None
        if tool_tier.is_compensable:
            if compensation is None:
                raise InvalidRequest(f"COMPENSABLE tool '{name}' needs a compensation")
            try:
                descriptor = CompensationDescriptor.from_dict(compensation)
                compensation_json = canonical_json(descriptor.to_dict())
            except ValueError as exc:
                raise InvalidRequest(f"invalid compensation: {exc}") from None
        record = ToolRecord(
            org_id=org_id,
            name=name,
            tier=tool_tier.value,
            version=version,
            compensation_json=compensation_json,
            idempotent_upstream=idempotent_upstream,
            upstream=upstream,
            updated_us=self._clock(),
        )
        async with self.store.transaction() as q:
            await q.upsert_tool(record)
        self._tools[(org_id, name)] = (record.updated_us + self._tool_cache_us, record)
        return record

    async def get_tool(self, org_id: str, name: str) -> ToolRecord:
        """The registered tool (cached briefly per process). Raises `ToolNotRegistered`."""
        now = self._clock()
        cached = self._tools.get((org_id, name))
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self.store.reader() as q:
            record = await q.get_tool(org_id, name)
        if record is None:
            self._tools.pop((org_id, name), None)
            raise ToolNotRegistered(name, org_id)
        self._tools[(org_id, name)] = (now + self._tool_cache_us, record)
        return record

    async def list_tools(self, org_id: str) -> list[ToolRecord]:
        async with self.store.reader() as q:
            return await q.list_tools(org_id)

    # -- policy rules (docs/approvals.md) ------------------------------------------------------

    async def get_rules(self, org_id: str) -> tuple[Rule, ...]:
        """The org's policy rules, parsed (cached briefly per process, like tools)."""
        now = self._clock()
        cached = self._rules.get(org_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self.store.reader() as q:
            record = await q.get_policy(org_id)
        # Stored rules were checked when saved; parsing them again only rebuilds the trees.
        rules = parse_rules(orjson.loads(record.rules_json)) if record else ()
        self._rules[org_id] = (now + self._tool_cache_us, rules)
        return rules

    async def put_rules(
        self, org_id: str, data: Any, *, updated_by: str | None = None
    ) -> tuple[Rule, ...]:
        """Replace the org's policy rules whole, after checking every one.

        Raises:
            InvalidRequest: the list or a rule is malformed (nothing is saved).
        """
        try:
            rules = parse_rules(data)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        now = self._clock()
        record = PolicyRecord(org_id, orjson.dumps(rules_json(rules)).decode(), now, updated_by)
        async with self.store.transaction() as q:
            await q.ensure_org_exists(org_id, now)
            await q.put_policy(record)
        self._rules[org_id] = (now + self._tool_cache_us, rules)
        return rules
