"""Typed server settings, read once at the edge (CLI flags, `UNDOLOG_*` env vars, a TOML file).

Precedence, highest first: CLI flag, environment variable, TOML file, default. Every field
maps 1:1 to a flag (`--lease-seconds`) and an env var (`UNDOLOG_LEASE_SECONDS`). The engine and
proxy take explicit arguments built from these settings, never the settings object itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from undolog.mcp.config import McpSettings, parse_mcp_settings
from undolog.upstreams import DEFAULT_UPSTREAM, check_tool_name, check_upstream_url
from undolog.webhook_config import WebhookConfig, parse_webhooks, read_secret
from undolog_sdk.tier import TIER_VALUES, CompensationDescriptor, ToolTier

__all__ = [
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
DEFAULT_APPROVAL_TIMEOUT_SECONDS = 3600
DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_APPROVAL_SWEEP_SECONDS = 1.0
DEFAULT_COMMIT_RETRY_ATTEMPTS = 5
DEFAULT_COMMIT_RETRY_BACKOFF_MS = 50
# Connection caps (`undolog.proxy.server`): one client must not be able to freeze the proxy.
DEFAULT_MAX_HEADER_BYTES = 32_768  # request line + headers; above: 431 and close
DEFAULT_HEADER_TIMEOUT_SECONDS = 10.0  # to receive a request's headers; then close
DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS = 5.0  # idle time between requests on one connection
DEFAULT_MAX_CONNECTIONS = 4096  # open at once; above: a canned 503 and close
DEFAULT_READY_TIMEOUT_SECONDS = 2.0  # for the store to answer `/ready`'s query
DEFAULT_LEASE_SWEEP_SECONDS = 2.0
DEFAULT_RETENTION_SWEEP_SECONDS = 600.0  # the retention sweep (docs/retention.md)
DEFAULT_RETENTION_BATCH_SIZE = 200  # sessions per transaction
MAX_RETENTION_BATCH_SIZE = 10_000  # the engine's bound (engine/retention.py MAX_BATCH_SIZE)
DEFAULT_SPOOL_DIR = "./undolog-spool"
DEFAULT_AUTH_FAILURE_LIMIT = 10
DEFAULT_AUTH_FAILURE_WINDOW_SECONDS = 60.0


def hash_api_key(key: str) -> str:
    """SHA-256 hex digest of an API key: the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeyConfig:
    """A named key of an org (`[[orgs.keys]]`): its SHA-256, its name and its role."""

    name: str
    role: str  # agent | approver | admin
    key_hash: str


@dataclass(frozen=True)
class OrgConfig:
    """An org declared in the config file.

    `api_key_hashes` holds SHA-256 hex digests of the legacy unnamed keys (`api_keys`,
    `api_key_sha256`: role `agent`, generated names); `keys` the named ones. Plain keys in
    the file are hashed on load.
    """

    org_id: str
    name: str = ""
    api_key_hashes: tuple[str, ...] = ()
    keys: tuple[KeyConfig, ...] = ()
    approval_timeout_seconds: int = DEFAULT_APPROVAL_TIMEOUT_SECONDS
    auto_approve_on_timeout: bool = False
    retention_days: int | None = None  # finished sessions kept (docs/retention.md); None: forever
    webhooks: tuple[WebhookConfig, ...] = ()  # [[orgs.webhooks]] (undolog.webhook_config)
    # `[[orgs.rules]]` (docs/approvals.md); None: the file names none, stored ones stay.
    rules: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class ToolConfig:
    """A tool declared in the config file, registered for one org at start-up."""

    org_id: str
    name: str
    tier: str
    version: str = "1.0.0"
    compensation: Mapping[str, Any] | None = None
    idempotent_upstream: bool = False
    upstream: str | None = None  # a configured upstream's name; None: `default`


@dataclass(frozen=True)
class UpstreamConfig:
    """A tool server declared in `[[upstreams]]`: where tools naming it are called.

    `secret` signs the org header of every call (read from the env var `secret_env` names,
    when that is how the file gives it); None: a random one per process. `orgs` empty: every
    org may use it.
    """

    name: str
    url: str
    secret: str | None = dataclasses.field(default=None, repr=False)
    orgs: tuple[str, ...] = ()


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
    ready_timeout_seconds: float = DEFAULT_READY_TIMEOUT_SECONDS
    lease_sweep_seconds: float = DEFAULT_LEASE_SWEEP_SECONDS
    retention_sweep_seconds: float = DEFAULT_RETENTION_SWEEP_SECONDS
    retention_batch_size: int = DEFAULT_RETENTION_BATCH_SIZE
    spool_dir: str = DEFAULT_SPOOL_DIR  # held results that could not be committed, for operators
    log_level: str = "info"
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
    # Webhooks (docs/notifications.md): links in messages start with `dashboard_url` (None:
    # this server's http://{host}:{port}); delivery attempts, their backoff and timeout.
    dashboard_url: str | None = None
    webhook_timeout_seconds: float = 5.0
    webhook_max_attempts: int = 10
    webhook_backoff_seconds: float = 1.0
    webhook_backoff_max_seconds: float = 300.0
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
    "ready_timeout_seconds",
    "retention_sweep_seconds",
    "db_pool_size",
    "webhook_timeout_seconds",
    "webhook_max_attempts",
    "webhook_backoff_seconds",
    "webhook_backoff_max_seconds",
)

_TOP_LEVEL_KEYS = frozenset({"server", "orgs", "tools", "upstreams", "mcp"})
_ORG_KEYS = frozenset(
    {
        "id",
        "name",
        "api_keys",
        "api_key_sha256",
        "keys",
        "approval_timeout_seconds",
        "auto_approve_on_timeout",
        "retention_days",
        "webhooks",
        "rules",
    }
)
_TOOL_KEYS = frozenset(
    {"org", "name", "tier", "version", "compensation", "idempotent_upstream", "upstream"}
)
_KEY_KEYS = frozenset({"name", "role", "key", "sha256"})
_ROLES = ("agent", "approver", "admin")
_UPSTREAM_KEYS = frozenset({"name", "url", "secret", "secret_env", "orgs"})
_DATABASE_SCHEMES = ("sqlite", "postgres", "postgresql")
_SHA256_HEX = frozenset("0123456789abcdef")


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


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
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


def _tables(data: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = data.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"'{key}' must be an array of tables ([[{key}]])")
    return items


def _checked(where: str, item: Mapping[str, Any], allowed: frozenset[str], *required: str) -> None:
    unknown = set(item) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    missing = [k for k in required if not isinstance(item.get(k), str) or not item[k]]
    if missing:
        raise ValueError(f"{where}: {', '.join(missing)} must be a non-empty string")


def _typed(where: str, value: Any, kind: type) -> Any:
    # bool is an int in Python; neither stands in for the other here.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value


def _key_list(where: str, value: Any) -> list[str]:
    # A bare string would be iterated character by character: one-letter API keys.
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: expected a list of non-empty strings")
    return value


def _sha256_list(where: str, hashes: list[str]) -> list[str]:
    lowered = [h.lower() for h in hashes]
    if any(len(h) != 64 or not set(h) <= _SHA256_HEX for h in lowered):
        raise ValueError(f"{where}: expected 64 hex digits per key")
    return lowered


def _named_keys(where: str, item: Mapping[str, Any]) -> tuple[KeyConfig, ...]:
    """`[[orgs.keys]]`: `name`, `role` and either `key` (hashed here) or `sha256`."""
    keys = []
    for n, entry in enumerate(_tables(item, "keys")):
        at = f"{where}.keys[{n}]"
        _checked(at, entry, _KEY_KEYS, "name", "role")
        if entry["role"] not in _ROLES:
            raise ValueError(f"{at}.role: expected one of {', '.join(_ROLES)}")
        plain, digest = entry.get("key"), entry.get("sha256")
        if (plain is None) == (digest is None):
            raise ValueError(f"{at}: give exactly one of key or sha256")
        if plain is not None:
            key_hash = hash_api_key(_key_list(f"{at}.key", [plain])[0])
        else:
            key_hash = _sha256_list(f"{at}.sha256", _key_list(f"{at}.sha256", [digest]))[0]
        keys.append(KeyConfig(name=entry["name"], role=entry["role"], key_hash=key_hash))
    return tuple(keys)


def _orgs_from_toml(data: Mapping[str, Any], env: Mapping[str, str]) -> tuple[OrgConfig, ...]:
    orgs = []
    for n, item in enumerate(_tables(data, "orgs")):
        where = f"orgs[{n}]"
        _checked(where, item, _ORG_KEYS, "id")
        sha256 = _key_list(f"{where}.api_key_sha256", item.get("api_key_sha256", []))
        plain = _key_list(f"{where}.api_keys", item.get("api_keys", []))
        hashes = _sha256_list(f"{where}.api_key_sha256", sha256)
        hashes += [hash_api_key(k) for k in plain]  # the plain keys are not kept
        timeout = item.get("approval_timeout_seconds", DEFAULT_APPROVAL_TIMEOUT_SECONDS)
        days = item.get("retention_days")  # absent: keep forever
        if days is not None and _typed(f"{where}.retention_days", days, int) < 1:
            raise ValueError(f"{where}.retention_days: expected a number of days >= 1")
        orgs.append(
            OrgConfig(
                org_id=item["id"],
                name=str(item.get("name", item["id"])),
                api_key_hashes=tuple(hashes),
                keys=_named_keys(where, item),
                approval_timeout_seconds=_typed(f"{where}.approval_timeout_seconds", timeout, int),
                auto_approve_on_timeout=_typed(
                    f"{where}.auto_approve_on_timeout",
                    item.get("auto_approve_on_timeout", False),
                    bool,
                ),
                retention_days=days,
                webhooks=parse_webhooks(where, item.get("webhooks"), env),
                # Checked at start-up by the engine, as the API checks them.
                rules=tuple(dict(r) for r in _tables(item, "rules")) if "rules" in item else None,
            )
        )
    seen: set[str] = set()
    for org in orgs:
        for key_hash in (*org.api_key_hashes, *(k.key_hash for k in org.keys)):
            if key_hash in seen:  # one key, one org and one role: never two
                raise ValueError(f"orgs: key {key_hash[:8]}... is listed more than once")
            seen.add(key_hash)
    return tuple(orgs)


def _tools_from_toml(data: Mapping[str, Any]) -> tuple[ToolConfig, ...]:
    tools = []
    for n, item in enumerate(_tables(data, "tools")):
        where = f"tools[{n}]"
        if "upstream_url" in item:
            raise ValueError(
                f"{where}.upstream_url is no longer accepted: declare the tool server in "
                '[[upstreams]] and name it with `upstream = "name"`'
            )
        _checked(where, item, _TOOL_KEYS, "org", "name", "tier")
        name_problem = check_tool_name(item["name"])
        if name_problem:
            raise ValueError(f"{where}.name: {name_problem}")
        if item["tier"] not in TIER_VALUES:
            raise ValueError(f"{where}.tier: expected one of {', '.join(TIER_VALUES)}")
        compensation = item.get("compensation")
        if compensation is not None:
            _typed(f"{where}.compensation", compensation, dict)
            try:  # the API's own rule, so a bad value stops the start, not every later call
                CompensationDescriptor.from_dict(compensation)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if item["tier"] == ToolTier.COMPENSABLE.value and compensation is None:
            raise ValueError(f"{where}: a compensable tool needs a compensation")
        upstream = item.get("upstream")
        if upstream is not None:
            _typed(f"{where}.upstream", upstream, str)
        tools.append(
            ToolConfig(
                org_id=item["org"],
                name=item["name"],
                tier=item["tier"],
                version=_typed(f"{where}.version", item.get("version", "1.0.0"), str),
                compensation=compensation,
                idempotent_upstream=_typed(
                    f"{where}.idempotent_upstream", item.get("idempotent_upstream", False), bool
                ),
                upstream=upstream,
            )
        )
    return tuple(tools)


def _upstreams_from_toml(
    data: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[UpstreamConfig, ...]:
    upstreams: list[UpstreamConfig] = []
    for n, item in enumerate(_tables(data, "upstreams")):
        where = f"upstreams[{n}]"
        _checked(where, item, _UPSTREAM_KEYS, "name", "url")
        name, url = item["name"], item["url"]
        if name == DEFAULT_UPSTREAM:
            raise ValueError(
                f"{where}.name: {DEFAULT_UPSTREAM!r} is the upstream of --upstream-url "
                "(UNDOLOG_UPSTREAM_URL, secret UNDOLOG_UPSTREAM_SECRET); pick another name"
            )
        if any(u.name == name for u in upstreams):
            raise ValueError(f"{where}.name: upstream {name!r} is declared twice")
        problem = check_upstream_url(url)
        if problem:
            raise ValueError(f"{where}.url {problem}")
        secret = read_secret(where, item, env)
        orgs = _key_list(f"{where}.orgs", item.get("orgs", []))
        upstreams.append(UpstreamConfig(name, url, secret, tuple(orgs)))
    return tuple(upstreams)


def _check_tool_upstreams(
    tools: tuple[ToolConfig, ...], upstreams: tuple[UpstreamConfig, ...]
) -> None:
    """Every `[[tools]] upstream` names a configured upstream that lets the tool's org in."""
    by_name = {u.name: u for u in upstreams}
    for n, tool in enumerate(tools):
        if tool.upstream is None or tool.upstream == DEFAULT_UPSTREAM:
            continue
        upstream = by_name.get(tool.upstream)
        if upstream is None:
            raise ValueError(f"tools[{n}].upstream: no upstream named {tool.upstream!r}")
        if upstream.orgs and tool.org_id not in upstream.orgs:
            raise ValueError(
                f"tools[{n}].upstream: upstream {tool.upstream!r} is not open to org "
                f"{tool.org_id!r} (its orgs: {', '.join(upstream.orgs)})"
            )


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
            orgs = _orgs_from_toml(data, env)
            tools = _tools_from_toml(data)
            upstreams = _upstreams_from_toml(data, env)
            _check_tool_upstreams(tools, upstreams)
            mcp = parse_mcp_settings(data.get("mcp"))
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
        if getattr(settings, name) <= 0:
            raise ValueError(f"setting {name!r} must be greater than 0")
    if not 1 <= settings.retention_batch_size <= MAX_RETENTION_BATCH_SIZE:
        raise ValueError(f"setting 'retention_batch_size' must be 1 to {MAX_RETENTION_BATCH_SIZE}")
    scheme = settings.database_url.partition("://")[0].lower()
    if scheme not in _DATABASE_SCHEMES or "://" not in settings.database_url:
        # Only the scheme is echoed: the rest of the URL may hold a password.
        raise ValueError(
            f"unsupported database URL scheme {scheme!r}: use sqlite:///path.db or postgresql://..."
        )
    return settings
