"""Typed server settings, read once at the edge (CLI flags, `UNDOLOG_*` env vars, a TOML file).

Precedence, highest first: CLI flag, environment variable, TOML file, default. Every field
maps 1:1 to a flag (`--lease-seconds`) and an env var (`UNDOLOG_LEASE_SECONDS`). The engine and
proxy take explicit arguments built from these settings, never the settings object itself.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from undolog.config_tables import (
    DEFAULT_APPROVAL_TIMEOUT_SECONDS,
    KeyConfig,
    OrgConfig,
    ToolConfig,
    UpstreamConfig,
    check_tool_upstreams,
    orgs_from_toml,
    tools_from_toml,
    upstreams_from_toml,
)
from undolog.engine.keys import hash_api_key
from undolog.mcp.config import McpSettings, check_mcp_orgs, parse_mcp_settings
from undolog.upstreams import check_upstream_url

__all__ = [
    "DEFAULT_APPROVAL_TIMEOUT_SECONDS",
    "DEFAULT_DATABASE_URL",
    "KeyConfig",
    "OrgConfig",
    "Settings",
    "ToolConfig",
    "UpstreamConfig",
    "hash_api_key",
    "load_settings",
]

DEFAULT_DATABASE_URL = "sqlite:///./undolog.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8090"
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_LOCK_MAX_ATTEMPTS = 100
DEFAULT_LOCK_RETRY_MS = 10
DEFAULT_DB_POOL_SIZE = 20  # PostgreSQL connections per process, LISTEN's not counted
DEFAULT_MAX_BODY_BYTES = 1_048_576
DEFAULT_UPSTREAM_TIMEOUT_SECONDS = 30.0
DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_APPROVAL_SWEEP_SECONDS = 1.0
DEFAULT_COMMIT_RETRY_ATTEMPTS = 5
DEFAULT_COMMIT_RETRY_BACKOFF_MS = 50
# Connection caps (`undolog.proxy.server`): one client must not be able to freeze the proxy.
DEFAULT_MAX_HEADER_BYTES = 32_768  # request line + headers; above: 431 and close
DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0  # to receive a request's headers; then close
DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS = 5.0  # idle time between requests on one connection
DEFAULT_MAX_CONNECTIONS = 4096  # open at once; above: a canned 503 and close
DEFAULT_BODY_TIMEOUT_SECONDS = 10.0  # to receive a request's body, plus the rate's allowance
DEFAULT_MIN_BODY_BYTES_PER_SECOND = 1024  # a body's slowest average rate past that time
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256  # per address, before a valid key: oldest shed first
DEFAULT_RESERVED_CONNECTIONS = 256  # of max_connections, only for verified (keyed) connections
DEFAULT_READY_TIMEOUT_SECONDS = 2.0  # for the store to answer `/ready`'s query
DEFAULT_LEASE_SWEEP_SECONDS = 2.0
DEFAULT_RETENTION_SWEEP_SECONDS = 600.0  # the retention sweep (docs/retention.md)
DEFAULT_RETENTION_BATCH_SIZE = 200  # sessions per transaction
MAX_RETENTION_BATCH_SIZE = 10_000  # the engine's bound (engine/retention.py MAX_BATCH_SIZE)
DEFAULT_SPOOL_DIR = "./undolog-spool"
DEFAULT_AUTH_FAILURE_LIMIT = 10
DEFAULT_AUTH_FAILURE_WINDOW_SECONDS = 60.0
# Quotas of each valid key, per process (services/quotas.py; README "Limits"): far above what
# an agent driven by a model does, far below a flood.
DEFAULT_KEY_CALLS_PER_SECOND = 50.0  # tool calls, sustained...
DEFAULT_KEY_CALL_BURST = 200  # ...and at once
DEFAULT_KEY_SESSIONS_PER_MINUTE = 120  # new sessions (as many at once)
DEFAULT_KEY_EVENT_STREAMS = 10  # open at once; an org holds 100, its agent keys 75 of them


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    upstream_url: str = DEFAULT_UPSTREAM_URL  # the upstream named `default`
    # Signs calls to `default` (env UNDOLOG_UPSTREAM_SECRET); None: random per process.
    upstream_secret: str | None = dataclasses.field(default=None, repr=False)
    upstream_timeout_seconds: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    lock_max_attempts: int = DEFAULT_LOCK_MAX_ATTEMPTS
    lock_retry_ms: int = DEFAULT_LOCK_RETRY_MS
    db_pool_size: int = DEFAULT_DB_POOL_SIZE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS
    approval_sweep_seconds: float = DEFAULT_APPROVAL_SWEEP_SECONDS
    commit_retry_attempts: int = DEFAULT_COMMIT_RETRY_ATTEMPTS
    commit_retry_backoff_ms: int = DEFAULT_COMMIT_RETRY_BACKOFF_MS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    header_timeout_seconds: float = DEFAULT_HEADER_TIMEOUT_SECONDS
    keep_alive_timeout_seconds: float = DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    min_body_bytes_per_second: int = DEFAULT_MIN_BODY_BYTES_PER_SECOND
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    reserved_connections: int = DEFAULT_RESERVED_CONNECTIONS
    # Peers whose X-Forwarded-For / X-Forwarded-Proto are trusted (IPs, CIDR networks, "*"),
    # comma-separated; empty: none, the client is the connection's peer.
    forwarded_allow_ips: str = ""
    ready_timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS
    lease_sweep_seconds: float = DEFAULT_LEASE_SWEEP_SECONDS
    retention_sweep_seconds: float = DEFAULT_RETENTION_SWEEP_SECONDS
    retention_batch_size: int = DEFAULT_RETENTION_BATCH_SIZE
    spool_dir: str = DEFAULT_SPOOL_DIR  # held results that could not be committed, for operators
    log_level: str = "info"
    # Apply pending migrations at start. Off: only `undolog migrate` does (a Kubernetes Job, a
    # compose service); the server then refuses a schema older than its own (docs/deploy.md).
    migrate: bool = True
    # TLS on the main port, by uvicorn itself: a PEM certificate (chain) and its key (None: the
    # key is in the certificate's file). The separate /metrics listener stays plain HTTP.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    workers: int | None = None  # processes on one port; None: one per core on PostgreSQL, else 1
    ui_secret: str | None = None  # signs dashboard session cookies; None: random per process
    # /metrics on the main port needs `Authorization: Bearer <metrics_token>`; without a token
    # it is not served there. `metrics_port` opens a second listener (no auth: bind it to a
    # private interface) that serves only /metrics.
    metrics_token: str | None = None
    metrics_host: str = DEFAULT_HOST
    metrics_port: int | None = None
    # Origins the dashboard is served from (scheme://host:port); empty: this server's own
    # http://{host}:{port} plus localhost and 127.0.0.1 on that port.
    allowed_origins: tuple[str, ...] = ()
    # Failed key checks and sign-ins per client address within the window, before 429.
    auth_failure_limit: int = DEFAULT_AUTH_FAILURE_LIMIT
    auth_failure_window_seconds: float = DEFAULT_AUTH_FAILURE_WINDOW_SECONDS
    # Quotas of each valid key, per process, then 429 rate_limited (services/quotas.py).
    key_calls_per_second: float = DEFAULT_KEY_CALLS_PER_SECOND
    key_call_burst: int = DEFAULT_KEY_CALL_BURST
    key_sessions_per_minute: int = DEFAULT_KEY_SESSIONS_PER_MINUTE
    key_event_streams: int = DEFAULT_KEY_EVENT_STREAMS
    # Webhooks (docs/notifications.md): links in messages start with `dashboard_url` (None:
    # this server's http://{host}:{port}); delivery attempts, their backoff and timeout.
    dashboard_url: str | None = None
    webhook_timeout_seconds: float = 5.0
    webhook_max_attempts: int = 10
    webhook_backoff_seconds: float = 1.0
    webhook_backoff_max_seconds: float = 300.0
    # The key that made a call may approve it (one approver only): for a single-person setup.
    # Off: every approval is by another key (docs/approvals.md, "Separation of duties").
    allow_self_approval: bool = False
    config: str | None = None
    orgs: tuple[OrgConfig, ...] = ()
    tools: tuple[ToolConfig, ...] = ()
    upstreams: tuple[UpstreamConfig, ...] = ()  # the [[upstreams]] tables
    mcp: McpSettings = dataclasses.field(default_factory=McpSettings)  # the [mcp] table


# Fields that can be set by flag / env var / the [server] table of the TOML file.
SCALAR_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Settings)
    if f.name not in {"orgs", "tools", "upstreams", "mcp"}
)


# A zero or negative cap would refuse every connection or disable the protection.
_POSITIVE_FIELDS = (
    "max_header_bytes",
    "header_timeout_seconds",
    "keep_alive_timeout_seconds",
    "max_connections",
    "body_timeout_seconds",
    "min_body_bytes_per_second",
    "max_connections_per_client",
    "ready_timeout_seconds",
    "retention_sweep_seconds",
    "db_pool_size",
    "webhook_timeout_seconds",
    "webhook_max_attempts",
    "webhook_backoff_seconds",
    "webhook_backoff_max_seconds",
    "key_calls_per_second",
    "key_call_burst",
    "key_sessions_per_minute",
    "key_event_streams",
)

_TOP_LEVEL_KEYS = frozenset({"server", "orgs", "tools", "upstreams", "mcp"})
_DATABASE_SCHEMES = ("sqlite", "postgres", "postgresql")


def _origins(raw: Any) -> tuple[str, ...]:
    """A list (TOML) or a comma-separated string (flag, env var) of origins."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"setting 'allowed_origins': expected a list of origins, got {raw!r}")
    origins = tuple(i.strip().rstrip("/").lower() for i in items if i.strip())
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
            raise ValueError(
                f"setting 'allowed_origins': {origin!r} is no origin (scheme://host[:port])"
            )
    return origins


def _forwarded_allow_ips(raw: Any) -> str:
    """A list (TOML) or a comma-separated string of IP addresses, CIDR networks or `*`."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"setting 'forwarded_allow_ips': expected addresses, got {raw!r}")
    entries = [i.strip() for i in items if i.strip()]
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"setting 'forwarded_allow_ips': {entry!r} is no IP address or network"
            ) from None
    return ",".join(entries)


_TRUE, _FALSE = frozenset({"true", "1", "yes", "on"}), frozenset({"false", "0", "no", "off"})


def _flag(name: str, raw: Any) -> bool:
    """A switch: a TOML or flag boolean, or an env var's true/false, 1/0, yes/no, on/off."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower() if isinstance(raw, str) else None
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"setting {name!r}: expected true or false, got {raw!r}")


def _coerce(name: str, raw: Any) -> Any:
    if name == "forwarded_allow_ips":
        return _forwarded_allow_ips(raw)
    kind = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
    if kind == "bool":
        return _flag(name, raw)
    if kind == "tuple[str, ...]":
        return _origins(raw)
    if kind == "int | None" and raw is None:
        return None
    kind = "int" if kind == "int | None" else kind
    if kind in ("int", "float"):
        # TOML hands over typed values: `port = true` or `port = 80.5` are mistakes, not 1 and 80.
        if isinstance(raw, bool) or (kind == "int" and isinstance(raw, float)):
            raise ValueError(f"setting {name!r}: expected a number, got {raw!r}")
        try:
            return int(raw) if kind == "int" else float(raw)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"setting {name!r}: expected a number, got {raw!r}") from exc
    return None if raw is None else str(raw)


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults, the TOML file, `UNDOLOG_*` env vars and flags (highest wins).

    Flags whose value is None count as not given. The TOML file is named by the `config`
    flag or `UNDOLOG_CONFIG`; its `[server]` table holds scalar settings, `[[orgs]]`,
    `[[tools]]` and `[[upstreams]]` arrays declare orgs, tools and named tool servers
    (`undolog.upstreams`), the `[mcp]` table the MCP gateway's upstream
    servers (`undolog.mcp.config`).
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    config_path = flags.get("config") or env.get("UNDOLOG_CONFIG")
    orgs: tuple[OrgConfig, ...] = ()
    tools: tuple[ToolConfig, ...] = ()
    upstreams: tuple[UpstreamConfig, ...] = ()
    mcp = McpSettings()
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read config file {config_path}: {exc}") from exc
        try:
            unknown = set(data) - _TOP_LEVEL_KEYS
            if unknown:
                raise ValueError(f"unknown tables or keys {sorted(unknown)}")
            server = data.get("server", {})
            if not isinstance(server, dict):
                raise ValueError("[server] must be a table")
            for key, raw in server.items():
                if key not in SCALAR_FIELDS:
                    raise ValueError(f"unknown setting [server].{key}")
                values[key] = _coerce(key, raw)
            orgs = orgs_from_toml(data, env)
            tools = tools_from_toml(data)
            upstreams = upstreams_from_toml(data, env)
            check_tool_upstreams(tools, upstreams)
            mcp = parse_mcp_settings(data.get("mcp"), env)
            check_mcp_orgs(mcp, [org.org_id for org in orgs])
        except ValueError as exc:
            raise ValueError(f"config file {config_path}: {exc}") from None
        values["config"] = str(config_path)
    for name in SCALAR_FIELDS:
        raw_env = env.get(f"UNDOLOG_{name.upper()}")
        if raw_env is not None and raw_env != "":
            values[name] = _coerce(name, raw_env)
    for name, raw in flags.items():
        if name in SCALAR_FIELDS:
            values[name] = _coerce(name, raw)
    settings = Settings(**values, orgs=orgs, tools=tools, upstreams=upstreams, mcp=mcp)
    problem = check_upstream_url(settings.upstream_url)
    if problem:
        # The URL itself is not echoed: it could carry a password.
        raise ValueError(f"setting 'upstream_url' {problem}")
    for name in _POSITIVE_FIELDS:
        if not 0 < getattr(settings, name) < math.inf:  # NaN and infinity too
            raise ValueError(f"setting {name!r} must be greater than 0 (and finite)")
    if settings.reserved_connections < 0:
        raise ValueError("setting 'reserved_connections' must be 0 or more")
    if not 1 <= settings.retention_batch_size <= MAX_RETENTION_BATCH_SIZE:
        raise ValueError(f"setting 'retention_batch_size' must be 1 to {MAX_RETENTION_BATCH_SIZE}")
    if settings.ssl_keyfile and not settings.ssl_certfile:
        raise ValueError("setting 'ssl_keyfile' needs 'ssl_certfile' (the certificate it signs)")
    scheme = settings.database_url.partition("://")[0].lower()
    if scheme not in _DATABASE_SCHEMES or "://" not in settings.database_url:
        # Only the scheme is echoed: the rest of the URL may hold a password.
        raise ValueError(
            f"unsupported database URL scheme {scheme!r}: use sqlite:///path.db or postgresql://..."
        )
    return settings
