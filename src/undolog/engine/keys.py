"""API keys: who may call, for which org, in which role, and until when.

Keys come from three places (`source`): the config file (`config`), the `undolog keys`
command (`cli`) and `serve --demo` (`demo`). The config is the source of truth for its keys:
at each start `sync_config` stores the keys it lists (moving a key to the org that lists it
now) and revokes every config key it no longer lists. Keys made by the CLI live until
revoked; each `serve --demo` revokes the previous demo keys. Only SHA-256 digests are stored.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from undolog.engine.model import now_us
from undolog.store.protocol import Store
from undolog.store.records import KeyRecord
from undolog_sdk.errors import InvalidRequest, NotFound


def hash_api_key(key: str) -> str:
    """SHA-256 hex digest of an API key: the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


__all__ = ["KeyGrant", "KeySource", "Keys", "Role", "new_key_id", "new_secret_key"]


class Role(enum.StrEnum):
    """What a key may do (the route table is `undolog.proxy.roles`)."""

    AGENT = "agent"  # tool calls, reads, rollback, SDK commit/fail and compensation claims
    APPROVER = "approver"  # approvals, reads, the dashboard
    ADMIN = "admin"  # everything: tools, resolve, undo retry/resolve


class KeySource(enum.StrEnum):
    CONFIG = "config"
    CLI = "cli"
    DEMO = "demo"


@dataclass(frozen=True)
class KeyGrant:
    """A key the config lists: its digest, its org, its name and its role."""

    org_id: str
    key_hash: str
    name: str
    role: Role


def new_key_id() -> str:
    return "key_" + secrets.token_hex(6)


def new_secret_key(prefix: str = "ul_") -> str:
    return prefix + secrets.token_urlsafe(24)


class Keys:
    """Key operations over a `Store` (start-up sync, the CLI, auth lookups)."""

    def __init__(self, store: Store, *, clock_us: Callable[[], int] = now_us) -> None:
        self.store = store
        self._clock = clock_us

    async def sync_config(self, grants: Iterable[KeyGrant]) -> int:
        """Store the config's keys and revoke config keys it no longer lists; returns how
        many were revoked. One transaction: no start sees half a key set."""
        now = self._clock()
        listed = list(grants)
        async with self.store.transaction() as q:
            for grant in listed:
                await q.put_api_key(
                    KeyRecord(new_key_id(), grant.key_hash, grant.org_id, grant.name,
                              grant.role.value, KeySource.CONFIG.value, now, None, None)
                )  # fmt: skip
            return await q.revoke_unlisted_keys(
                KeySource.CONFIG.value, {g.key_hash for g in listed}, now
            )

    async def create(
        self, org_id: str, name: str, role: str, source: KeySource = KeySource.CLI
    ) -> tuple[str, KeyRecord]:
        """A new key for `org_id` (the org is created bare if unknown); returns the key,
        shown once, and its record.

        Raises:
            InvalidRequest: an unknown role, or an empty name or org.
        """
        try:
            checked = Role(role)
        except ValueError:
            raise InvalidRequest(
                f"unknown role {role!r}: expected one of agent, approver, admin"
            ) from None
        if not org_id or not name:
            raise InvalidRequest("a key needs an org and a name")
        secret = new_secret_key("ul_demo_" if source is KeySource.DEMO else "ul_")
        now = self._clock()
        record = KeyRecord(new_key_id(), hash_api_key(secret), org_id, name, checked.value,
                           source.value, now, None, None)  # fmt: skip
        async with self.store.transaction() as q:
            await q.ensure_org_exists(org_id, now)
            stored = await q.put_api_key(record)
        return secret, stored

    async def revoke_source(self, source: KeySource, org_id: str) -> int:
        """Revoke every live key of `source` in `org_id` (the previous demo keys)."""
        async with self.store.transaction() as q:
            return await q.revoke_unlisted_keys(source.value, (), self._clock(), org_id)

    async def revoke(self, key_id: str) -> None:
        """Revoke a key (and end its dashboard sessions). Raises `NotFound`."""
        async with self.store.transaction() as q:
            if not await q.revoke_key(key_id, self._clock()):
                raise NotFound(f"no live key with id '{key_id}'")

    async def list(self, org_id: str | None = None) -> list[KeyRecord]:
        async with self.store.reader() as q:
            return await q.list_keys(org_id)

    async def live(self, key_hash: str) -> KeyRecord | None:
        async with self.store.reader() as q:
            return await q.live_key(key_hash)

    async def touch(self, key_id: str) -> None:
        async with self.store.autocommit() as q:
            await q.touch_key(key_id, self._clock())
