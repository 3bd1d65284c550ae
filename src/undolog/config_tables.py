"""The `[[orgs]]`, `[[tools]]` and `[[upstreams]]` tables of the config file: their typed
records and how each table is read and checked (`undolog.config` merges them into `Settings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from undolog.engine.keys import hash_api_key
from undolog.upstreams import DEFAULT_UPSTREAM, check_tool_name, check_upstream_url
from undolog.webhook_config import WebhookConfig, parse_webhooks, read_secret
from undolog_sdk.tier import TIER_VALUES, CompensationDescriptor, ToolTier

DEFAULT_APPROVAL_TIMEOUT_SECONDS = 3600
_SHA256_HEX = frozenset("0123456789abcdef")


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


def orgs_from_toml(data: Mapping[str, Any], env: Mapping[str, str]) -> tuple[OrgConfig, ...]:
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


def tools_from_toml(data: Mapping[str, Any]) -> tuple[ToolConfig, ...]:
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


def upstreams_from_toml(
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


def check_tool_upstreams(
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
