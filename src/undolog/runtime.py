"""The services, built once: the store, engine, saga, approvals, executor, leases, held
results, deliveries, events, metrics and log that every front end (REST, MCP, approvals) is
handed. Nothing here knows HTTP; `undolog.proxy.app` serves these over HTTP, and the MCP
gateway over MCP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import structlog

from undolog.config import Settings
from undolog.engine import Engine
from undolog.engine.approvals import Approvals
from undolog.engine.keys import KeyGrant, Keys, Role
from undolog.engine.saga import Saga
from undolog.services.delivery import Deliveries
from undolog.services.events import EventBroker
from undolog.services.executor import ToolExecutor
from undolog.services.held import HeldResults
from undolog.services.lease import LeaseKeeper
from undolog.services.metrics import ProxyMetrics
from undolog.services.quotas import KeyQuotas
from undolog.services.waits import Waits
from undolog.services.webhooks import WebhookSender, subscriptions
from undolog.store import Store, open_store
from undolog.store.base import load_migrations
from undolog.upstreams import UpstreamRegistry
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.tier import ToolTier

__all__ = [
    "Runtime",
    "config_key_grants",
    "ensure_schema",
    "open_runtime",
    "prepare_store",
    "unknown_tool_org",
    "upstream_registry",
    "webhook_sender",
]


@dataclass
class Runtime:
    """Everything a request handler needs, built once per app."""

    store: Store
    engine: Engine
    saga: Saga
    approvals: Approvals
    broker: EventBroker
    executor: ToolExecutor
    metrics: ProxyMetrics
    deliveries: Deliveries
    leases: LeaseKeeper
    held: HeldResults
    retry_after_seconds: int
    commit_retry_attempts: int
    commit_retry_backoff_ms: int
    log: Any
    keys: Keys
    # Tools whose tier the operator's config sets: (org, tool name) → "config", and the MCP
    # gateway's upstream prefixes ("git." ...) for every org. The API cannot change them.
    config_tools: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    gateway_prefixes: tuple[str, ...] = ()
    webhooks: WebhookSender | None = None  # started by the app with the sweeps
    waits: Waits | None = None  # long waits (GET /approvals/{id}?wait=N), on the broker
    quotas: KeyQuotas | None = None  # each key's calls and new sessions (None: not counted)

    def config_owner(self, org_id: str, tool_name: str) -> str | None:
        """Who sets this tool's tier, if not the API: `config` ([[tools]]) or `mcp`."""
        if (org_id, tool_name) in self.config_tools:
            return "config"
        if tool_name.startswith(self.gateway_prefixes):
            return "mcp"
        return None


def config_key_grants(settings: Settings) -> list[KeyGrant]:
    """Every key the config lists: the legacy unnamed ones (role `agent`, a generated name)
    and the named `[[orgs.keys]]`."""
    grants = []
    for org in settings.orgs:
        grants += [
            KeyGrant(org.org_id, h, f"{org.org_id}-legacy-{h[:8]}", Role.AGENT)
            for h in org.api_key_hashes
        ]
        grants += [KeyGrant(org.org_id, k.key_hash, k.name, Role(k.role)) for k in org.keys]
    return grants


async def unknown_tool_org(
    store: Store, settings: Settings, declared: set[str] | None = None
) -> str | None:
    """A line naming the first `[[tools]]` entry whose org is neither declared (`[[orgs]]`,
    or `declared`) nor in the store, or None. Checked before anything is written."""
    known = {org.org_id for org in settings.orgs} | (declared or set())
    where = f"config file {settings.config}: " if settings.config else ""
    for n, tool in enumerate(settings.tools):
        if tool.org_id in known:
            continue
        async with store.reader() as q:
            found = await q.get_org(tool.org_id)
        if found is None:
            return (
                f"{where}tools[{n}] ({tool.name}) names org {tool.org_id!r}, which is not in "
                f'[[orgs]] nor in the database: add an [[orgs]] table with id = "{tool.org_id}"'
            )
        known.add(tool.org_id)
    return None


async def warn_without_autovacuum(store: Store) -> bool:
    """Log a warning when the PostgreSQL server runs without autovacuum (True if it did):
    the planner then never gets statistics, and lookups planned on small tables stay slow as
    they grow (docs/deploy.md, "PostgreSQL sizing")."""
    from undolog.store.postgres import PostgresStore

    if not isinstance(store, PostgresStore) or await store.autovacuum_on():
        return False
    structlog.get_logger("undolog.proxy").warning(
        "postgres_autovacuum_off",
        hint="the server's autovacuum is off: run ANALYZE on this database regularly (or turn "
        "autovacuum on), or lookups planned while the tables were small read whole orgs",
    )
    return True


async def ensure_schema(store: Store, *, migrate: bool) -> int:
    """Apply pending migrations (`migrate`), or only check that `undolog migrate` has: a schema
    older than this release's is refused, a newer one (a later release migrated it during a
    rolling upgrade) is served. Returns the schema version in force.

    Raises:
        ValueError: `migrate` is off and the schema is older than this release's.
    """
    if migrate:
        return await store.migrate()
    current = await store.schema_version()
    needed = max(version for version, _ in load_migrations(store.dialect))
    if current < needed:
        raise ValueError(
            f"the database schema is at version {current}, this release needs {needed}: run "
            "`undolog migrate` first (migrations at start are off: --no-migrate)"
        )
    return current


async def prepare_store(store: Store, settings: Settings) -> None:
    """Migrate the store (or check its schema: `ensure_schema`) and seed the configured orgs,
    keys and tools.

    Done once per start: by `open_runtime` in a single process, by the supervisor before it
    starts its workers (`undolog serve --workers N`), so N processes never race to do it.
    """
    await ensure_schema(store, migrate=settings.migrate)
    await warn_without_autovacuum(store)
    problem = await unknown_tool_org(store, settings)
    if problem:
        raise ValueError(problem)
    engine = Engine(store)
    for org in settings.orgs:
        await engine.ensure_org(
            org.org_id,
            name=org.name,
            approval_timeout_s=org.approval_timeout_seconds,
            auto_approve_on_timeout=org.auto_approve_on_timeout,
            retention_days=org.retention_days,
        )
        if org.rules is not None:  # the file's rules replace the stored ones at start
            try:
                await engine.put_rules(org.org_id, list(org.rules), updated_by="config")
            except InvalidRequest as exc:
                raise ValueError(f"[[orgs]] {org.org_id!r}: {exc.message}") from None
    # The config is the source of truth for its keys: listed ones are stored (moved to the
    # org that lists them now), the others revoked.
    await Keys(store).sync_config(config_key_grants(settings))
    for tool in settings.tools:
        await engine.register_tool(
            tool.org_id,
            tool.name,
            tier=ToolTier(tool.tier).value,
            version=tool.version,
            compensation=dict(tool.compensation) if tool.compensation else None,
            idempotent_upstream=tool.idempotent_upstream,
            upstream=tool.upstream,
        )
    # The config is the source of truth for webhooks too: the outbox trigger reads these.
    async with store.transaction() as q:
        await q.replace_webhook_subscriptions(
            subscriptions((org.org_id, org.webhooks) for org in settings.orgs)
        )


async def open_runtime(
    settings: Settings, metrics: ProxyMetrics | None = None, *, prepare: bool = True
) -> Runtime:
    """Open the store, prepare it (`prepare_store`; skipped with `prepare=False`, when a
    supervisor has done it for its workers) and open the executor."""
    upstreams = upstream_registry(settings)
    store = await open_store(
        settings.database_url,
        lock_max_attempts=settings.lock_max_attempts,
        lock_retry_ms=settings.lock_retry_ms,
        pool_size=settings.db_pool_size,
    )
    try:
        if prepare:
            await prepare_store(store, settings)
        engine = Engine(
            store,
            lease_seconds=settings.lease_seconds,
            retry_after_seconds=settings.retry_after_seconds,
        )
        keys = Keys(store)
        executor = ToolExecutor(upstreams, timeout_seconds=settings.upstream_timeout_seconds)
        await executor.open()
    except BaseException:
        # Every failure path closes the store: its threads or pool would keep the process alive.
        await store.close()
        raise
    if settings.lease_seconds <= settings.upstream_timeout_seconds:
        # A duplicate arriving after the lease but before the upstream gives up would find
        # a call that is still running "in doubt" (or re-run an idempotent one beside it).
        structlog.get_logger("undolog.proxy").warning(
            "lease_shorter_than_upstream_timeout",
            lease_seconds=settings.lease_seconds,
            upstream_timeout_seconds=settings.upstream_timeout_seconds,
        )
    proxy_metrics = metrics or ProxyMetrics.create()
    leases = LeaseKeeper(engine, settings.lease_seconds)
    broker = EventBroker(store, proxy_metrics, max_per_key=settings.key_event_streams)
    return Runtime(
        store=store,
        engine=engine,
        saga=Saga(store, lease_seconds=settings.lease_seconds),
        approvals=Approvals(engine, allow_self_approval=settings.allow_self_approval),
        broker=broker,
        executor=executor,
        metrics=proxy_metrics,
        deliveries=Deliveries(engine),
        leases=leases,
        held=HeldResults(
            settings.spool_dir,
            engine=engine,
            leases=leases,
            metrics=proxy_metrics,
            backoff_ms=settings.commit_retry_backoff_ms,
        ),
        retry_after_seconds=settings.retry_after_seconds,
        commit_retry_attempts=max(1, settings.commit_retry_attempts),
        commit_retry_backoff_ms=settings.commit_retry_backoff_ms,
        log=structlog.get_logger("undolog.proxy"),
        keys=keys,
        config_tools={(t.org_id, t.name): "config" for t in settings.tools},
        gateway_prefixes=tuple(f"{u.name}." for u in settings.mcp.upstreams),
        webhooks=webhook_sender(store, settings),
        waits=Waits(broker),
        quotas=KeyQuotas(
            calls_per_second=settings.key_calls_per_second,
            call_burst=settings.key_call_burst,
            sessions_per_minute=settings.key_sessions_per_minute,
        ),
    )


def webhook_sender(store: Store, settings: Settings) -> WebhookSender:
    """The sender of the configured webhooks (docs/notifications.md)."""
    return WebhookSender(
        store,
        {(org.org_id, hook.name): hook for org in settings.orgs for hook in org.webhooks},
        dashboard_url=settings.dashboard_url or f"http://{settings.host}:{settings.port}",
        log=structlog.get_logger("undolog.webhooks"),
        timeout_seconds=settings.webhook_timeout_seconds,
        max_attempts=settings.webhook_max_attempts,
        backoff_seconds=settings.webhook_backoff_seconds,
        backoff_max_seconds=settings.webhook_backoff_max_seconds,
    )


def upstream_registry(settings: Settings) -> UpstreamRegistry:
    """The configured upstreams; an upstream without a secret gets a random one (warned).

    Raises:
        ValueError: a URL that is not a plain http(s) base URL (settings built in code skip
            the checks `load_settings` makes).
    """
    registry = UpstreamRegistry.build(
        settings.upstream_url,
        settings.upstream_secret,
        [(u.name, u.url, u.secret, u.orgs) for u in settings.upstreams],
    )
    for upstream in registry:
        if upstream.secret_generated:
            # Still signed, but with a key no tool server holds: it cannot tell orgs apart.
            structlog.get_logger("undolog.proxy").warning(
                "upstream_secret_generated",
                upstream=upstream.name,
                hint="set UNDOLOG_UPSTREAM_SECRET or the upstream's secret/secret_env so the "
                "tool server can verify X-UndoLog-Signature",
            )
    return registry
