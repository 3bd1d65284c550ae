"""Shared SQL, part 3: the store-wide counts behind the saga-health gauges.

Read by every proxy's approval sweep (docs/observability.md, "Gauges across processes"): a
few rows per org, from indexes — pending approvals from `approvals_by_timeout` (status
first), in-doubt effects from the partial index `effects_in_doubt` (migration 18). That index
holds only in-doubt rows, so the state is written into this statement as the wire value of
`EffectState.IN_DOUBT` (a bound parameter would give PostgreSQL's generic plan no index).
"""

from __future__ import annotations

from collections.abc import Sequence

from undolog.store._sql.accounts import AccountSql
from undolog_sdk.wire import ApprovalStatus, EffectState

_IN_DOUBT = EffectState.IN_DOUBT.value
assert _IN_DOUBT.isidentifier()  # a literal in the SQL below: letters and underscores only


class HealthSql(AccountSql):
    """Counts across every org, grouped by org (no org filter: the gauges are per org)."""

    async def pending_approvals_by_age(
        self, cutoffs_us: Sequence[int], status: str = ApprovalStatus.PENDING.value
    ) -> dict[str, list[int]]:
        """{org: [how many pending approvals were created at or before each cutoff]}."""
        if not cutoffs_us:
            return {}
        sums = ", ".join("SUM(CASE WHEN created_us <= ? THEN 1 ELSE 0 END)" for _ in cutoffs_us)
        rows = await self._fetch(
            f"SELECT org_id, {sums} FROM approvals WHERE status = ? GROUP BY org_id",
            *cutoffs_us,
            status,
        )
        return {str(r[0]): [int(v or 0) for v in r[1:]] for r in rows}

    async def effects_in_doubt_by_org(self) -> dict[str, int]:
        """{org: how many effects are in doubt now}."""
        rows = await self._fetch(
            f"SELECT org_id, COUNT(*) FROM effects WHERE state = '{_IN_DOUBT}' GROUP BY org_id"
        )
        return {str(r[0]): int(r[1]) for r in rows}
