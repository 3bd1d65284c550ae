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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_DATABASE_URL",
    "OrgConfig",
    "Settings",
    "ToolConfig",
    "hash_api_key",
    "load_settings",
]

DEFAULT_DATABASE_URL = "sqlite:///./undolog.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_UPSTREAM_URL = "http://127.0.0.1:8090"
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_LOCK_MAX_ATTEMPTS = 50
DEFAULT_LOCK_RETRY_MS = 10
DEFAULT_MAX_BODY_BYTES = 1_048_576
DEFAULT_UPSTREAM_TIMEOUT_SECONDS = 30.0
DEFAULT_APPROVAL_TIMEOUT_SECONDS = 3600
DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_COMMIT_RETRY_ATTEMPTS = 5
DEFAULT_COMMIT_RETRY_BACKOFF_MS = 50


def hash_api_key(key: str) -> str:
    """SHA-256 hex digest of an API key: the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class OrgConfig:
    """An org declared in the config file.

    `api_key_hashes` holds SHA-256 hex digests; plain `api_keys` in the file are hashed on load.
    """

    org_id: str
    name: str = ""
    api_key_hashes: tuple[str, ...] = ()
    approval_timeout_seconds: int = DEFAULT_APPROVAL_TIMEOUT_SECONDS
    auto_approve_on_timeout: bool = False


@dataclass(frozen=True)
class ToolConfig:
    """A tool declared in the config file, registered for one org at start-up."""

    org_id: str
    name: str
    tier: str
    version: str = "1.0.0"
    compensation: Mapping[str, Any] | None = None
    idempotent_upstream: bool = False
    upstream_url: str | None = None


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    upstream_url: str = DEFAULT_UPSTREAM_URL
    upstream_timeout_seconds: float = DEFAULT_UPSTREAM_TIMEOUT_SECONDS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    lock_max_attempts: int = DEFAULT_LOCK_MAX_ATTEMPTS
    lock_retry_ms: int = DEFAULT_LOCK_RETRY_MS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS
    commit_retry_attempts: int = DEFAULT_COMMIT_RETRY_ATTEMPTS
    commit_retry_backoff_ms: int = DEFAULT_COMMIT_RETRY_BACKOFF_MS
    log_level: str = "info"
    config: str | None = None
    orgs: tuple[OrgConfig, ...] = ()
    tools: tuple[ToolConfig, ...] = ()


# Fields that can be set by flag / env var / the [server] table of the TOML file.
SCALAR_FIELDS = tuple(
    f.name for f in dataclasses.fields(Settings) if f.name not in {"orgs", "tools"}
)


def _coerce(name: str, raw: Any) -> Any:
    kind = {f.name: f.type for f in dataclasses.fields(Settings)}[name]
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"setting {name!r}: expected a number, got {raw!r}") from exc
    return None if raw is None else str(raw)


def _orgs_from_toml(data: Mapping[str, Any]) -> tuple[OrgConfig, ...]:
    orgs = []
    for item in data.get("orgs", []):
        hashes = [str(h).lower() for h in item.get("api_key_sha256", [])]
        hashes += [hash_api_key(str(k)) for k in item.get("api_keys", [])]
        orgs.append(
            OrgConfig(
                org_id=str(item["id"]),
                name=str(item.get("name", item["id"])),
                api_key_hashes=tuple(hashes),
                approval_timeout_seconds=int(
                    item.get("approval_timeout_seconds", DEFAULT_APPROVAL_TIMEOUT_SECONDS)
                ),
                auto_approve_on_timeout=bool(item.get("auto_approve_on_timeout", False)),
            )
        )
    return tuple(orgs)


def _tools_from_toml(data: Mapping[str, Any]) -> tuple[ToolConfig, ...]:
    tools = []
    for item in data.get("tools", []):
        tools.append(
            ToolConfig(
                org_id=str(item["org"]),
                name=str(item["name"]),
                tier=str(item["tier"]),
                version=str(item.get("version", "1.0.0")),
                compensation=item.get("compensation"),
                idempotent_upstream=bool(item.get("idempotent_upstream", False)),
                upstream_url=item.get("upstream_url"),
            )
        )
    return tuple(tools)


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge defaults, the TOML file, `UNDOLOG_*` env vars and flags (highest wins).

    Flags whose value is None count as not given. The TOML file is named by the `config`
    flag or `UNDOLOG_CONFIG`; its `[server]` table holds scalar settings, `[[orgs]]` and
    `[[tools]]` arrays declare orgs and tools.
    """
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    config_path = flags.get("config") or env.get("UNDOLOG_CONFIG")
    orgs: tuple[OrgConfig, ...] = ()
    tools: tuple[ToolConfig, ...] = ()
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read config file {config_path}: {exc}") from exc
        for key, raw in data.get("server", {}).items():
            if key not in SCALAR_FIELDS:
                raise ValueError(f"config file {config_path}: unknown setting [server].{key}")
            values[key] = _coerce(key, raw)
        orgs = _orgs_from_toml(data)
        tools = _tools_from_toml(data)
        values["config"] = str(config_path)
    for name in SCALAR_FIELDS:
        raw_env = env.get(f"UNDOLOG_{name.upper()}")
        if raw_env is not None and raw_env != "":
            values[name] = _coerce(name, raw_env)
    for name, raw in flags.items():
        if name in SCALAR_FIELDS:
            values[name] = _coerce(name, raw)
    return Settings(**values, orgs=orgs, tools=tools)
