"""Named upstream tool servers, and the signed header that tells one which org is calling.

Where a tool call goes is operator configuration, never tenant input: the config file's
`[[upstreams]]` tables (plus `--upstream-url`, the upstream named `default`) are the only
addresses the proxy will ever send a tool call to, and an org may use an upstream only if the
upstream lists it (or lists no orgs at all). `PUT /tools/{name}` picks an upstream by name.

Every call to an upstream is signed for its org (`signed_headers`, from
`undolog_sdk.upstream`): an HMAC-SHA256, under the upstream's secret, over the method, the
path, the tool, a BLAKE3 digest of the body sent, the org, the effect id and the time, sent as
`X-UndoLog-Signature: v2=...` beside `X-UndoLog-Org`, `-Tool`, `-Effect-Id` and `-Timestamp`.
A tool server verifies it with `undolog_sdk.upstream.verify_request` (docs/upstreams.md). An
upstream with no configured secret gets one generated per process (logged as a warning): the
calls are still signed, but no tool server can verify them until the operator configures the
secret on both sides.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

from undolog_sdk.upstream import (
    EFFECT_HEADER,
    ORG_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TOOL_HEADER,
    signed_headers,
)

__all__ = [
    "DEFAULT_UPSTREAM",
    "EFFECT_HEADER",
    "ORG_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "TOOL_HEADER",
    "Upstream",
    "UpstreamRegistry",
    "check_tool_name",
    "check_upstream_url",
    "signed_headers",
    "tool_url",
]

DEFAULT_UPSTREAM = "default"
"""The name of the upstream set by `--upstream-url` (`UNDOLOG_UPSTREAM_URL`)."""

TOOL_NAME_MAX = 128
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def check_tool_name(name: str) -> str | None:
    """Why `name` cannot be a tool's name, or None when it can.

    A tool's name becomes a path segment of its upstream's URL, so it is kept to letters,
    digits and `_ . - :` (which covers MCP gateway names such as `git.git_create_branch`),
    1 to 128 of them, and not only dots (`.` and `..` are path navigation).
    """
    if not _TOOL_NAME.fullmatch(name) or not name.strip("."):
        return (
            f"tool name must be 1 to {TOOL_NAME_MAX} letters, digits or _ . - : (and not only dots)"
        )
    return None


def check_upstream_url(url: str) -> str | None:
    """Why `url` cannot be an upstream base URL, or None when it can.

    Only plain `http(s)://host[:port][/path]`: no credentials (they would end up in logs and
    error texts), no query or fragment (either would swallow the `/tools/{name}` the proxy
    appends, so a call could land on any path of the host).
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not carry a user or password"
    if parts.query or parts.fragment or "?" in url or "#" in url:
        return "must not have a query (?) or fragment (#)"
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return "must not contain spaces or control characters"
    if not url.isascii():
        # Sent as written (the tool name is the only part the proxy encodes).
        return "must be ASCII (punycode the host, percent-encode the path)"
    return None


def tool_url(base_url: str, tool_name: str) -> str:
    """`{base}/tools/{name}` with the name percent-encoded, whatever it holds.

    Registered names are already restricted to a safe charset; encoding them anyway means a
    name can never add a path segment, a query or a fragment to the address.
    """
    return f"{base_url.rstrip('/')}/tools/{quote(tool_name, safe='')}"


@dataclass(frozen=True)
class Upstream:
    """A tool server the operator configured.

    `orgs` empty: every org may use it; otherwise only the listed ones. `secret_generated`:
    nobody configured the secret, so this process made one up (nobody can verify it).
    """

    name: str
    url: str
    secret: str = field(repr=False)
    orgs: frozenset[str] = frozenset()
    secret_generated: bool = False

    def allows(self, org_id: str) -> bool:
        return not self.orgs or org_id in self.orgs


class UpstreamRegistry:
    """The configured upstreams by name; what the executor and `PUT /tools` consult."""

    def __init__(self, upstreams: Iterable[Upstream]) -> None:
        self._by_name: dict[str, Upstream] = {}
        for upstream in upstreams:
            if upstream.name in self._by_name:
                raise ValueError(f"upstream {upstream.name!r} is configured twice")
            self._by_name[upstream.name] = upstream

    @classmethod
    def build(
        cls,
        default_url: str,
        default_secret: str | None,
        named: Iterable[tuple[str, str, str | None, Iterable[str]]] = (),
    ) -> UpstreamRegistry:
        """The registry of `default` (from `--upstream-url`) and the `[[upstreams]]` tables.

        Args:
            named: `(name, url, secret or None, orgs)` per configured upstream.

        Raises:
            ValueError: a URL `check_upstream_url` refuses, or a name given twice.
        """
        items: list[tuple[str, str, str | None, tuple[str, ...]]]
        items = [(DEFAULT_UPSTREAM, default_url, default_secret, ())]
        items += [(n, u, s, tuple(o)) for n, u, s, o in named]
        for name, url, _, _ in items:
            problem = check_upstream_url(url)
            if problem:
                raise ValueError(f"upstream {name!r}: URL {problem}")
        return cls(
            Upstream(
                name=name,
                url=url.rstrip("/"),
                secret=secret or secrets.token_urlsafe(32),
                orgs=frozenset(orgs),
                secret_generated=not secret,
            )
            for name, url, secret, orgs in items
        )

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self._by_name.values())

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str | None) -> Upstream | None:
        """The upstream called `name` (None: `default`), or None when none is configured."""
        return self._by_name.get(name or DEFAULT_UPSTREAM)

    def for_org(self, name: str | None, org_id: str) -> Upstream | None:
        """The upstream `name` if `org_id` may use it, else None (unknown or not allowed)."""
        upstream = self.get(name)
        return upstream if upstream is not None and upstream.allows(org_id) else None

    def usable_by(self, org_id: str) -> list[str]:
        """The names `org_id` may pick, sorted (for error messages)."""
        return sorted(n for n, u in self._by_name.items() if u.allows(org_id))
