"""`undolog_sdk.upstream`: the v2 signature binds the request, and `verify_request` refuses
anything else (issue 22: a captured `echo` call was accepted as `transfer_funds` to `mallory`,
and timestamps 300 s in the future passed)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from undolog_sdk.errors import AuthFailed, InvalidUpstreamSignature
from undolog_sdk.upstream import (
    MAX_FUTURE_SECONDS,
    MAX_PAST_SECONDS,
    SIGNATURE_HEADER,
    VerifiedRequest,
    signed_headers,
    verify_request,
)

pytestmark = pytest.mark.security

NOW = 1_790_000_000.0
SECRET = "s3cret"
EFFECT = "0d1f7e8a-1111-4222-8333-444455556666"


def body(tool_args: dict[str, Any]) -> bytes:
    return orjson.dumps({"args": tool_args, "session_id": "s", "effect_id": EFFECT})


ECHO = body({"hello": "world"})
THEFT = body({"from_account": "acme-main", "to_account": "mallory", "amount": 500})


def sign(tool: str = "echo", content: bytes = ECHO, org: str = "acme", now: float = NOW) -> Any:
    return signed_headers(
        SECRET, org_id=org, method="POST", path=f"/v1/tools/{tool}", tool=tool, body=content,
        effect_id=EFFECT, now=now,
    )  # fmt: skip


def test_a_valid_request_is_accepted_with_what_it_vouches_for() -> None:
    headers = {k.lower(): v for k, v in sign().items()}  # any header case
    verified = verify_request(SECRET, headers, "post", "/v1/tools/echo", ECHO, now=NOW + 1)
    assert verified == VerifiedRequest("acme", "echo", EFFECT, int(NOW), verified.body_digest)
    assert sign()[SIGNATURE_HEADER].startswith("v2=")


def test_a_captured_echo_call_replayed_as_transfer_funds_is_refused() -> None:
    captured = sign()
    replays = [
        ("/v1/tools/transfer_funds", THEFT),  # other path, tool and body
        ("/v1/tools/transfer_funds", ECHO),  # other path and tool only
        ("/v1/tools/echo", THEFT),  # other arguments only
    ]
    for path, content in replays:
        with pytest.raises(InvalidUpstreamSignature, match="does not match"):
            verify_request(SECRET, captured, "POST", path, content, now=NOW)
    with pytest.raises(InvalidUpstreamSignature):  # the tool header swapped to match the path
        forged = {**captured, "X-UndoLog-Tool": "transfer_funds"}
        verify_request(SECRET, forged, "POST", "/v1/tools/transfer_funds", THEFT, now=NOW)


def test_a_timestamp_300_s_in_the_future_is_refused() -> None:
    with pytest.raises(InvalidUpstreamSignature, match="future"):
        verify_request(SECRET, sign(now=NOW + 300), "POST", "/v1/tools/echo", ECHO, now=NOW)
    ahead = sign(now=NOW + MAX_FUTURE_SECONDS)  # clock skew within the window
    assert verify_request(SECRET, ahead, "POST", "/v1/tools/echo", ECHO, now=NOW).org_id == "acme"


def test_a_timestamp_past_the_window_is_refused() -> None:
    old = sign(now=NOW - MAX_PAST_SECONDS - 1)
    with pytest.raises(InvalidUpstreamSignature, match="expired"):
        verify_request(SECRET, old, "POST", "/v1/tools/echo", ECHO, now=NOW)
    # The window is the verifier's to set.
    accepted = verify_request(
        SECRET, old, "POST", "/v1/tools/echo", ECHO, now=NOW, max_past_seconds=120
    )
    assert accepted.org_id == "acme"
    with pytest.raises(InvalidUpstreamSignature, match="future"):
        verify_request(
            SECRET, sign(now=NOW + 2), "POST", "/v1/tools/echo", ECHO, now=NOW,
            max_future_seconds=0,
        )  # fmt: skip


def test_a_request_signed_for_another_org_is_refused() -> None:
    forged = {**sign(org="acme"), "X-UndoLog-Org": "globex"}
    with pytest.raises(InvalidUpstreamSignature, match="does not match"):
        verify_request(SECRET, forged, "POST", "/v1/tools/echo", ECHO, now=NOW)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"X-UndoLog-Signature": None}, "missing X-UndoLog-Signature"),
        ({"X-UndoLog-Effect-Id": "other"}, "does not match"),
        ({"X-UndoLog-Signature": "v1=00"}, "not a v2= signature"),
        ({"X-UndoLog-Timestamp": "1e9"}, "whole Unix seconds"),
        ({"X-UndoLog-Org": "acme\nPOST"}, "line break"),
    ],
)
def test_a_missing_old_or_malformed_header_is_refused(
    change: dict[str, str | None], why: str
) -> None:
    headers = {k: v for k, v in {**sign(), **change}.items() if v is not None}
    with pytest.raises(InvalidUpstreamSignature, match=why) as caught:
        verify_request(SECRET, headers, "POST", "/v1/tools/echo", ECHO, now=NOW)
    assert isinstance(caught.value, AuthFailed) and caught.value.http_status == 401


def test_another_secret_or_method_is_refused() -> None:
    with pytest.raises(InvalidUpstreamSignature):
        verify_request("guess", sign(), "POST", "/v1/tools/echo", ECHO, now=NOW)
    with pytest.raises(InvalidUpstreamSignature):
        verify_request(SECRET, sign(), "PUT", "/v1/tools/echo", ECHO, now=NOW)


def test_the_path_is_signed_percent_decoded() -> None:
    headers = signed_headers(
        SECRET, org_id="acme", method="POST", path="/tools/ns%3Atool", tool="ns:tool",
        body=ECHO, effect_id=EFFECT, now=NOW,
    )  # fmt: skip
    verified = verify_request(SECRET, headers, "POST", "/tools/ns:tool", ECHO, now=NOW)
    assert verified.tool == "ns:tool"


def test_signing_refuses_a_line_break_in_a_value() -> None:
    with pytest.raises(ValueError, match="line break"):
        sign(org="acme\nglobex")
