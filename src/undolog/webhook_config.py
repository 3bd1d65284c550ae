"""The `[[orgs.webhooks]]` tables of the config file: where an org's notifications go.

A webhook is operator configuration only: its URL never comes from an API request, so an
agent cannot point the server at a target of its choosing (docs/notifications.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from undolog.services.webhooks import WEBHOOK_EVENTS, WEBHOOK_KINDS, WebhookConfig

__all__ = ["WEBHOOK_EVENTS", "WEBHOOK_KINDS", "WebhookConfig", "parse_webhooks", "read_secret"]

_KEYS = frozenset({"name", "url", "secret", "secret_env", "kind", "events"})
_MAX_NAME = 64


def read_secret(where: str, item: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """`secret` (given in the file) or `secret_env` (the name of an env var holding it)."""
    if "secret" in item and "secret_env" in item:
        raise ValueError(f"{where}: give secret or secret_env, not both")
    secret = item.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise ValueError(f"{where}.secret: expected a non-empty string")
    if "secret_env" in item:
        var = item["secret_env"]
        if not isinstance(var, str) or not var:
            raise ValueError(f"{where}.secret_env: expected the name of an env var")
        secret = env.get(var)
        if not secret:
            raise ValueError(f"{where}.secret_env: env var {var} is not set")
    return secret


def check_webhook_url(url: str) -> str | None:
    """Why `url` cannot be a webhook URL, or None. Plain http(s) with a host, no user or
    password (they would end up in logs), no spaces or control characters, ASCII."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return "is not a valid URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not carry a user or password"
    if not url.isascii() or any(c.isspace() or ord(c) < 0x20 for c in url):
        return "must be ASCII without spaces or control characters"
    return None


def parse_webhooks(where: str, raw: Any, env: Mapping[str, str]) -> tuple[WebhookConfig, ...]:
    """An org's `webhooks` array of tables. Raises ValueError naming the bad entry."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(i, dict) for i in raw):
        raise ValueError(f"{where}.webhooks must be an array of tables ([[orgs.webhooks]])")
    hooks: list[WebhookConfig] = []
    for n, item in enumerate(raw):
        at = f"{where}.webhooks[{n}]"
        unknown = set(item) - _KEYS
        if unknown:
            raise ValueError(f"{at}: unknown keys {sorted(unknown)}")
        name, url = item.get("name"), item.get("url")
        if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
            raise ValueError(f"{at}.name: expected a string of 1 to {_MAX_NAME} characters")
        if any(h.name == name for h in hooks):
            raise ValueError(f"{at}.name: webhook {name!r} is declared twice")
        if not isinstance(url, str):
            raise ValueError(f"{at}.url: expected a string")
        problem = check_webhook_url(url)
        if problem:  # the URL is not echoed: it may hold a token
            raise ValueError(f"{at}.url {problem}")
        kind = item.get("kind", "json")
        if kind not in WEBHOOK_KINDS:
            raise ValueError(f"{at}.kind: expected one of {', '.join(WEBHOOK_KINDS)}")
        secret = read_secret(at, item, env)
        if secret is None and kind == "json":
            raise ValueError(f"{at}: a json webhook needs secret or secret_env (it signs)")
        events = item.get("events", list(WEBHOOK_EVENTS))
        if (
            not isinstance(events, list)
            or not events
            or not all(isinstance(e, str) and e in WEBHOOK_EVENTS for e in events)
        ):
            raise ValueError(f"{at}.events: expected a list of {', '.join(WEBHOOK_EVENTS)}")
        hooks.append(WebhookConfig(name, url, secret, kind, tuple(dict.fromkeys(events))))
    return tuple(hooks)
