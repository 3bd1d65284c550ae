"""The [mcp] table: upstreams, tool policies, and tiers from config or annotations."""

from __future__ import annotations

from pathlib import Path

import pytest

from undolog.config import load_settings
from undolog.mcp.config import McpToolPolicy, parse_mcp_settings, tier_for
from undolog.mcp.mapping import MappingError, resolve_mapping

_TOML = """
[mcp]
allowed_origins = ["https://agent.example.com"]

[[mcp.upstreams]]
name = "memory"
command = "npx"
args = ["-y", "@modelcontextprotocol/server-memory"]
env = { MEMORY_FILE_PATH = "/tmp/memory.jsonl" }

[mcp.upstreams.tools.create_entities]
tier = "compensable"
compensation.tool = "delete_entities"
compensation.args = { entityNames = "$.original_args.entities[*].name" }

[[mcp.upstreams]]
name = "remote"
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer token" }

[mcp.upstreams.tools.search]
tier = "safe"
"""


def test_the_config_file_declares_stdio_and_http_upstreams(tmp_path: Path) -> None:
    path = tmp_path / "undolog.toml"
    path.write_text(_TOML)
    mcp = load_settings({"config": str(path)}, env={}).mcp
    memory, remote = mcp.upstreams
    assert (memory.transport, memory.command, memory.args) == (
        "stdio",
        "npx",
        ("-y", "@modelcontextprotocol/server-memory"),
    )
    assert memory.env == {"MEMORY_FILE_PATH": "/tmp/memory.jsonl"}
    compensation = memory.tools["create_entities"].compensation
    assert compensation is not None and compensation.tool == "delete_entities"
    assert (remote.transport, remote.url) == ("http", "https://mcp.example.com/mcp")
    assert remote.headers == {"Authorization": "Bearer token"}
    assert mcp.allowed_origins == ("https://agent.example.com",)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"upstreams": [{"name": "a.b", "command": "x"}]}, "without '.'"),
        ({"upstreams": [{"name": "a", "transport": "stdio"}]}, "needs a command"),
        ({"upstreams": [{"name": "a", "transport": "http"}]}, "needs a url"),
        ({"upstreams": [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]}, "dup"),
        ({"upstreams": [{"name": "a", "command": "x", "tools": {"t": {"tier": "x"}}}]}, "tier"),
        (
            {"upstreams": [{"name": "a", "command": "x", "tools": {"t": {"tier": "compensable"}}}]},
            "needs a compensation",
        ),
        ({"upstreams": [{"name": "a", "command": "x", "port": 1}]}, "unknown keys"),
    ],
)
def test_a_bad_mcp_table_is_refused_with_the_reason(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mcp_settings(raw)


def test_the_config_tier_wins_over_annotations() -> None:
    assert tier_for(McpToolPolicy(tier="irreversible"), read_only_hint=True) == "irreversible"
    assert tier_for(McpToolPolicy(tier="safe"), read_only_hint=False) == "safe"


def test_without_config_read_only_tools_are_safe_and_the_rest_irreversible() -> None:
    assert tier_for(None, read_only_hint=True) == "safe"
    assert tier_for(None, read_only_hint=False) == "irreversible"
    assert tier_for(None, read_only_hint=None) == "irreversible"
    assert tier_for(McpToolPolicy(), read_only_hint=True) == "safe"


def test_a_mapping_builds_compensation_args_from_the_forward_call() -> None:
    payload = {
        "original_args": {"entities": [{"name": "ada"}, {"name": "bob"}]},
        "original_result": {"output": {"structuredContent": {"id": 7}}},
    }
    template = {
        "entityNames": "$.original_args.entities[*].name",
        "first": "$.original_args.entities[0].name",
        "id": "$.original_result.output.structuredContent.id",
        "literal": ["plain", 1],
    }
    assert resolve_mapping(template, payload) == {
        "entityNames": ["ada", "bob"],
        "first": "ada",
        "id": 7,
        "literal": ["plain", 1],
    }


@pytest.mark.parametrize("path", ["$.missing", "$.original_args.entities[5]", "$.x[*]", "$..a"])
def test_a_mapping_that_does_not_match_is_an_error(path: str) -> None:
    with pytest.raises(MappingError):
        resolve_mapping({"v": path}, {"original_args": {"entities": []}, "x": 1})


# -- orgs: an upstream belongs to the orgs it lists, or is shared on purpose ----------------------

_TWO_ORGS = """
[[orgs]]
id = "acme"
[[orgs]]
id = "globex"
"""

_MEMORY = """
[[mcp.upstreams]]
name = "memory"
command = "npx"
"""


@pytest.mark.security
@pytest.mark.parametrize(
    ("upstream", "message"),
    [
        ("", r"mcp.upstreams\[0\] \('memory'\) names no orgs, and the config declares 2 orgs"),
        ('orgs = ["acme", "globex"]', r"mcp.upstreams\[0\] \('memory'\) is open to 2 orgs"),
    ],
    ids=["unscoped", "several orgs, not shared"],
)
def test_an_upstream_several_orgs_would_share_unknowingly_is_refused_at_start(
    tmp_path: Path, upstream: str, message: str
) -> None:
    path = tmp_path / "undolog.toml"
    path.write_text(_TWO_ORGS + _MEMORY + upstream + "\n")
    with pytest.raises(ValueError, match=message) as refused:
        load_settings({"config": str(path)}, env={})
    assert "shared = true" in str(refused.value) and "orgs = [" in str(refused.value)


@pytest.mark.parametrize(
    ("orgs", "upstream"),
    [
        (_TWO_ORGS, 'orgs = ["acme"]'),
        (_TWO_ORGS, "shared = true"),
        (_TWO_ORGS, 'orgs = ["acme", "globex"]\nshared = true'),
        ('[[orgs]]\nid = "acme"\n', ""),  # one org: it is that org's
        ("", ""),
    ],
)
def test_an_upstream_with_its_orgs_or_shared_is_accepted(
    tmp_path: Path, orgs: str, upstream: str
) -> None:
    path = tmp_path / "undolog.toml"
    path.write_text(orgs + _MEMORY + upstream + "\n")
    (memory,) = load_settings({"config": str(path)}, env={}).mcp.upstreams
    assert memory.allows("acme")
    assert memory.allows("globex") == ("acme" not in memory.orgs or "globex" in memory.orgs)


@pytest.mark.security
def test_an_unscoped_upstream_with_several_orgs_is_refused_when_the_app_is_built(
    tmp_path: Path,
) -> None:
    """Settings made in code skip `load_settings`: the proxy refuses them all the same."""
    from undolog.config import OrgConfig, Settings
    from undolog.proxy import create_app

    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'undolog.db'}",
        orgs=(OrgConfig(org_id="acme"), OrgConfig(org_id="globex")),
        mcp=parse_mcp_settings({"upstreams": [{"name": "memory", "command": "npx"}]}),
    )
    with pytest.raises(ValueError, match="names no orgs"):
        create_app(settings)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "a", "command": "x", "orgs": "acme"}, r"orgs: expected a list"),
        ({"name": "a", "command": "x", "orgs": []}, r"orgs: expected a list"),
        ({"name": "a", "command": "x", "shared": "yes"}, r"shared: expected true or false"),
        ({"name": "a", "command": "x", "secret": "s"}, r"a stdio upstream has no secret"),
        ({"name": "a", "url": "http://x/mcp", "secret": ""}, r"secret: expected a non-empty"),
    ],
)
def test_bad_orgs_shared_or_secret_keys_are_refused(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mcp_settings({"upstreams": [raw]})


def test_an_http_upstreams_secret_may_come_from_the_environment() -> None:
    raw = {"upstreams": [{"name": "a", "url": "http://x/mcp", "secret_env": "NOTES_SECRET"}]}
    (upstream,) = parse_mcp_settings(raw, env={"NOTES_SECRET": "s3cret"}).upstreams
    assert upstream.secret == "s3cret"
    assert "s3cret" not in repr(upstream)
    with pytest.raises(ValueError, match="NOTES_SECRET is not set"):
        parse_mcp_settings(raw, env={})
