"""The signed request UndoLog sends a tool server, and the helper a tool server verifies it with.

Every call the proxy makes to an upstream tool server carries five headers:

| header | value |
|---|---|
| `X-UndoLog-Org` | the calling org |
| `X-UndoLog-Tool` | the tool being called |
| `X-UndoLog-Effect-Id` | the effect the call belongs to (also the `Idempotency-Key`) |
| `X-UndoLog-Timestamp` | Unix time in whole seconds, when the proxy signed the call |
| `X-UndoLog-Signature` | `v2=` + hex HMAC-SHA256 of the v2 message, under the upstream's secret |

The v2 message is the UTF-8 of these lines joined by `\\n`:

    v2
    {METHOD}            upper case, e.g. POST
    {path}              the request's path, percent-decoded, no query (`/tools/send_email`)
    {tool}
    {body digest}       hex BLAKE3-256 of the exact body bytes sent
    {org}
    {effect_id}
    {timestamp}

So a signature binds who calls, which tool, with which arguments, for which effect and when: a
captured `echo` call cannot be replayed as `transfer_funds`, to another org, with other
arguments, nor outside a short window (`verify_request` takes 60 s in the past and 5 s in the
future by default). Within the window a captured request can still be sent again as it is:
deduplicate on `Idempotency-Key`, as the protocol asks. No value may hold a line break.

It needs only the standard library and `blake3`: a tool server may use it without the rest of
the SDK (docs/upstreams.md shows a receiver).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from blake3 import blake3

from undolog_sdk.errors import InvalidUpstreamSignature

__all__ = [
    "EFFECT_HEADER",
    "MAX_FUTURE_SECONDS",
    "MAX_PAST_SECONDS",
    "ORG_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_VERSION",
    "TIMESTAMP_HEADER",
    "TOOL_HEADER",
    "VerifiedRequest",
    "sign_request",
    "signed_headers",
    "verify_request",
]

ORG_HEADER = "X-UndoLog-Org"
TOOL_HEADER = "X-UndoLog-Tool"
EFFECT_HEADER = "X-UndoLog-Effect-Id"
TIMESTAMP_HEADER = "X-UndoLog-Timestamp"
SIGNATURE_HEADER = "X-UndoLog-Signature"

SIGNATURE_VERSION = "v2"
"""The scheme of the signature header's value (`v2=<hex>`); v1 (org, effect, time only) is gone."""

MAX_PAST_SECONDS = 60.0
"""How old a signed timestamp may be, by default, and still count."""
MAX_FUTURE_SECONDS = 5.0
"""How far ahead of the verifier's clock a signed timestamp may be, by default (clock skew)."""


@dataclass(frozen=True, slots=True)
class VerifiedRequest:
    """What a verified signature vouches for."""

    org_id: str
    tool: str
    effect_id: str
    timestamp: int
    body_digest: str  # hex BLAKE3-256 of the body


def _digest(body: bytes) -> str:
    return blake3(body).hexdigest()


def _path(path: str) -> str:
    """The signed form of a path: percent-decoded, without query or fragment."""
    return unquote(path.split("?", 1)[0].split("#", 1)[0])


def _message(
    method: str, path: str, tool: str, digest: str, org_id: str, effect_id: str, timestamp: str
) -> bytes:
    parts = [SIGNATURE_VERSION, method.upper(), _path(path), tool, digest, org_id, effect_id]
    parts.append(timestamp)
    if any("\n" in p or "\r" in p for p in parts):
        raise ValueError("a signed value holds a line break")
    return "\n".join(parts).encode("utf-8")


def sign_request(
    secret: str,
    *,
    org_id: str,
    method: str,
    path: str,
    tool: str,
    body: bytes,
    effect_id: str,
    timestamp: int,
) -> str:
    """The `X-UndoLog-Signature` value (`v2=` + hex) of one request.

    Raises:
        ValueError: a value holds a line break (it could pass for another field).
    """
    message = _message(method, path, tool, _digest(body), org_id, effect_id, str(timestamp))
    return f"{SIGNATURE_VERSION}={hmac.digest(secret.encode(), message, 'sha256').hex()}"


def signed_headers(
    secret: str,
    *,
    org_id: str,
    method: str,
    path: str,
    tool: str,
    body: bytes,
    effect_id: str,
    now: float | None = None,
) -> dict[str, str]:
    """The five UndoLog headers of one signed request (see the module's docstring).

    Args:
        secret: the upstream's secret.
        path: the path the request is sent to (percent-encoded or not: it is signed decoded).
        body: the exact bytes sent as the body.
        now: the signer's clock, Unix seconds (default: the current time).
    """
    timestamp = int(time.time() if now is None else now)
    signature = sign_request(
        secret, org_id=org_id, method=method, path=path, tool=tool, body=body,
        effect_id=effect_id, timestamp=timestamp,
    )  # fmt: skip
    return {
        ORG_HEADER: org_id,
        TOOL_HEADER: tool,
        EFFECT_HEADER: effect_id,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: signature,
    }


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name) or headers.get(name.lower())
    if not value:
        raise InvalidUpstreamSignature(f"missing {name} header")
    return value


def verify_request(
    secret: str,
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    now: float | None = None,
    *,
    max_past_seconds: float = MAX_PAST_SECONDS,
    max_future_seconds: float = MAX_FUTURE_SECONDS,
) -> VerifiedRequest:
    """For tool servers: check that UndoLog signed this very request, and for whom.

    Args:
        secret: the secret shared with the proxy's upstream configuration.
        headers: the request's headers (a case-insensitive mapping, such as Starlette's or
            httpx's, or one with lower-cased keys).
        method: the request's method.
        path: the request's path as received (`request.url.path`).
        body: the raw body bytes as received (before any JSON parsing).
        now: the verifier's clock, Unix seconds (default: the current time).
        max_past_seconds: how old the signature may be.
        max_future_seconds: how far ahead of `now` its timestamp may be.

    Returns:
        The org, tool, effect and time the signature vouches for. Route by the path; the tool
        and effect id are those the proxy meant (the body's `effect_id` is covered too).

    Raises:
        InvalidUpstreamSignature: a header is missing or malformed, the timestamp is outside
            the window, or the signature does not match this method, path, body, tool, org
            and effect. Answer 401 and run nothing.
    """
    org_id = _header(headers, ORG_HEADER)
    tool = _header(headers, TOOL_HEADER)
    effect_id = _header(headers, EFFECT_HEADER)
    stamp = _header(headers, TIMESTAMP_HEADER)
    signature = _header(headers, SIGNATURE_HEADER)
    if not signature.startswith(f"{SIGNATURE_VERSION}="):
        raise InvalidUpstreamSignature(
            f"{SIGNATURE_HEADER} is not a {SIGNATURE_VERSION}= signature"
        )
    if not (stamp.isascii() and stamp.isdigit()):
        raise InvalidUpstreamSignature(f"{TIMESTAMP_HEADER} is not whole Unix seconds")
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if timestamp > current + max_future_seconds:
        raise InvalidUpstreamSignature("the signature's timestamp is in the future")
    if timestamp < current - max_past_seconds:
        raise InvalidUpstreamSignature("the signature has expired")
    digest = _digest(body)
    try:
        message = _message(method, path, tool, digest, org_id, effect_id, stamp)
    except ValueError:
        raise InvalidUpstreamSignature("a signed header holds a line break") from None
    expected = f"{SIGNATURE_VERSION}={hmac.digest(secret.encode(), message, 'sha256').hex()}"
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise InvalidUpstreamSignature(
            "the signature does not match this request (method, path, tool, body, org, effect)"
        )
    return VerifiedRequest(org_id, tool, effect_id, timestamp, digest)
