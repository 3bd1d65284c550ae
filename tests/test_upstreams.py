"""`undolog.upstreams` without a server: URL and name rules, the registry, signatures."""

from __future__ import annotations

import pytest

from undolog.upstreams import (
    DEFAULT_UPSTREAM,
    UpstreamRegistry,
    check_tool_name,
    check_upstream_url,
    tool_url,
)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8090", "https://tools.internal/v2/", "http://[::1]:9000/base", "http://h"],
)
def test_plain_http_base_urls_are_accepted(url: str) -> None:
    assert check_upstream_url(url) is None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://h/",
        "//h/x",
        "http://u:p@h/",
        "http://u@h/",
        "http://h/x?",
        "http://h/x#",
        "http://h/?a=1",
        "http://h:99999/",
        "http://h:port/",
        "http:///x",
        "http://h/\nx",
        "http://bücher.example/",
    ],
)
def test_urls_that_could_redirect_a_call_are_refused(url: str) -> None:
    assert check_upstream_url(url) is not None


@pytest.mark.parametrize("name", ["send_email", "git.git_create_branch", "ns:t-1", "a" * 128, ".a"])
def test_safe_tool_names_are_accepted(name: str) -> None:
    assert check_tool_name(name) is None


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a?b", "a#b", "a b", "a%2F", "café", "a\x00", "a" * 129]
)
def test_unsafe_tool_names_are_refused(name: str) -> None:
    assert check_tool_name(name) is not None


def test_tool_urls_percent_encode_the_name_whatever_it_holds() -> None:
    assert tool_url("http://h/base/", "a.b") == "http://h/base/tools/a.b"
    assert tool_url("http://h", "../x?y#z") == "http://h/tools/..%2Fx%3Fy%23z"


def test_the_registry_resolves_names_per_org() -> None:
    registry = UpstreamRegistry.build(
        "http://tools:8090", None, [("billing", "http://billing/", "s3cr3t-b", ["acme"])]
    )
    default = registry.get(None)
    assert default is not None
    assert default.name == DEFAULT_UPSTREAM
    assert default.secret_generated
    assert default.secret  # generated, never empty
    assert registry.for_org("billing", "acme") is not None
    assert registry.for_org("billing", "beta") is None
    assert registry.for_org("nope", "acme") is None
    assert registry.usable_by("beta") == [DEFAULT_UPSTREAM]
    assert registry.usable_by("acme") == ["billing", DEFAULT_UPSTREAM]
    billing = registry.get("billing")
    assert billing is not None
    assert billing.url == "http://billing"
    assert billing.secret == "s3cr3t-b"
    assert "s3cr3t-b" not in repr(billing)


def test_the_registry_refuses_a_bad_url_even_from_code() -> None:
    with pytest.raises(ValueError, match="'default'"):
        UpstreamRegistry.build("http://h/?", None)
