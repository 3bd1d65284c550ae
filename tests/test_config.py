"""`undolog.config.load_settings`: precedence of flags, env, TOML and defaults; orgs and tools
declared in TOML; and the config mistakes that must fail at start-up, not at 3 a.m."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from undolog import config as config_module
from undolog.config import (
    DEFAULT_DATABASE_URL,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_PORT,
    KeyConfig,
    OrgConfig,
    Settings,
    ToolConfig,
    UpstreamConfig,
    load_settings,
)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


WriteToml = Callable[[str], str]


@pytest.fixture
def write_toml(tmp_path: Path) -> WriteToml:
    """Writes a TOML config file and returns its path."""

    def write(text: str) -> str:
        path = tmp_path / "undolog.toml"
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


def load(config: str | None = None, env: dict[str, str] | None = None, **flags: object) -> Settings:
    return load_settings({"config": config, **flags}, env or {})


# --- precedence --------------------------------------------------------------------------


def test_with_nothing_given_the_defaults_apply() -> None:
    settings = load()
    assert settings == Settings()
    assert settings.database_url == DEFAULT_DATABASE_URL
    assert settings.port == DEFAULT_PORT
    assert settings.orgs == settings.tools == ()


def test_toml_beats_defaults_env_beats_toml_and_flags_beat_env(write_toml: WriteToml) -> None:
    config = write_toml(
        "[server]\nport = 1111\nlease_seconds = 1.5\nhost = '0.0.0.0'\nmax_body_bytes = 99\n"
    )
    env = {"UNDOLOG_PORT": "2222", "UNDOLOG_LEASE_SECONDS": "2.5"}
    settings = load(config, env, port=3333)
    assert settings.port == 3333  # flag
    assert settings.lease_seconds == 2.5  # env
    assert settings.host == "0.0.0.0"  # TOML
    assert settings.max_body_bytes == 99  # TOML
    assert settings.upstream_timeout_seconds == Settings().upstream_timeout_seconds  # default
    assert settings.config == config


def test_flags_given_as_none_and_empty_env_vars_count_as_not_given(write_toml: WriteToml) -> None:
    config = write_toml("[server]\nport = 1111\n")
    settings = load(config, {"UNDOLOG_PORT": ""}, port=None, lease_seconds=None)
    assert settings.port == 1111
    assert settings.lease_seconds == DEFAULT_LEASE_SECONDS


def test_the_config_file_can_be_named_by_env(write_toml: WriteToml) -> None:
    config = write_toml("[server]\nretry_after_seconds = 9\n")
    settings = load_settings({}, {"UNDOLOG_CONFIG": config})
    assert settings.retry_after_seconds == 9
    assert settings.config == config


def test_every_scalar_setting_has_an_env_var() -> None:
    env = {
        "UNDOLOG_DATABASE_URL": "postgresql://u@h/db",
        "UNDOLOG_HOST": "0.0.0.0",
        "UNDOLOG_PORT": "1",
        "UNDOLOG_UPSTREAM_URL": "http://tools:1",
        "UNDOLOG_UPSTREAM_TIMEOUT_SECONDS": "2.5",
        "UNDOLOG_LEASE_SECONDS": "3",
        "UNDOLOG_LOCK_MAX_ATTEMPTS": "4",
        "UNDOLOG_LOCK_RETRY_MS": "5",
        "UNDOLOG_MAX_BODY_BYTES": "6",
        "UNDOLOG_RETRY_AFTER_SECONDS": "7",
        "UNDOLOG_COMMIT_RETRY_ATTEMPTS": "8",
        "UNDOLOG_COMMIT_RETRY_BACKOFF_MS": "9",
        "UNDOLOG_LOG_LEVEL": "debug",
        "UNDOLOG_WORKERS": "3",
        "UNDOLOG_DB_POOL_SIZE": "11",
    }
    settings = load_settings({}, env)
    assert settings == Settings(
        database_url="postgresql://u@h/db",
        host="0.0.0.0",
        port=1,
        upstream_url="http://tools:1",
        upstream_timeout_seconds=2.5,
        lease_seconds=3.0,
        lock_max_attempts=4,
        lock_retry_ms=5,
        max_body_bytes=6,
        retry_after_seconds=7,
        commit_retry_attempts=8,
        commit_retry_backoff_ms=9,
        log_level="debug",
        workers=3,
        db_pool_size=11,
    )


# --- orgs and tools ----------------------------------------------------------------------

ORG_TOML = """
[[orgs]]
id = "acme"
name = "Acme Corp"
api_keys = ["ul_plain_secret_key"]
api_key_sha256 = ["{upper_hash}"]
approval_timeout_seconds = 60
auto_approve_on_timeout = true

[[orgs]]
id = "beta"
"""


def test_plain_api_keys_are_hashed_on_load_and_not_kept(write_toml: WriteToml) -> None:
    other_hash = sha256("ul_other_key")
    config = write_toml(ORG_TOML.format(upper_hash=other_hash.upper()))
    settings = load(config)
    acme, beta = settings.orgs
    assert acme == OrgConfig(
        org_id="acme",
        name="Acme Corp",
        api_key_hashes=(other_hash, sha256("ul_plain_secret_key")),
        approval_timeout_seconds=60,
        auto_approve_on_timeout=True,
    )
    assert beta == OrgConfig(org_id="beta", name="beta")
    assert "ul_plain_secret_key" not in repr(settings)


def test_named_keys_carry_a_role_and_are_hashed_on_load(write_toml: WriteToml) -> None:
    digest = sha256("ul_approver")
    config = write_toml(
        "[[orgs]]\nid = 'acme'\n"
        "[[orgs.keys]]\nname = 'bot'\nrole = 'agent'\nkey = 'ul_agent'\n"
        f"[[orgs.keys]]\nname = 'alice'\nrole = 'approver'\nsha256 = '{digest.upper()}'\n"
    )
    settings = load(config)
    (acme,) = settings.orgs
    assert acme.keys == (
        KeyConfig(name="bot", role="agent", key_hash=sha256("ul_agent")),
        KeyConfig(name="alice", role="approver", key_hash=digest),
    )
    assert "ul_agent" not in repr(settings)


def test_tools_are_read_from_toml(write_toml: WriteToml) -> None:
    config = write_toml(
        """
[[tools]]
org = "acme"
name = "send_email"
tier = "compensable"
version = "2.0.0"
idempotent_upstream = true
upstream = "mail"
compensation = { fn_name = "undo_send_email", max_retries = 5 }

[[upstreams]]
name = "mail"
url = "http://mail:9000"

[[tools]]
org = "acme"
name = "search_web"
tier = "safe"
"""
    )
    email, search = load(config).tools
    assert email == ToolConfig(
        org_id="acme",
        name="send_email",
        tier="compensable",
        version="2.0.0",
        compensation={"fn_name": "undo_send_email", "max_retries": 5},
        idempotent_upstream=True,
        upstream="mail",
    )
    assert search == ToolConfig(org_id="acme", name="search_web", tier="safe")


# --- mistakes ----------------------------------------------------------------------------

BAD_TOML = {
    "an unknown [server] key": "[server]\nbogus = 1\n",
    "a misspelt table": "[sever]\nport = 1\n",
    "a number that is text": "[server]\nport = 'eighty'\n",
    "a boolean for a number": "[server]\nport = true\n",
    "a fraction for an integer": "[server]\nport = 80.5\n",
    "a float that is text": "[server]\nlease_seconds = 'long'\n",
    "[server] that is no table": "server = 1\n",
    "invalid TOML": "[server\n",
    "an org without id": "[[orgs]]\nname = 'x'\n",
    "an org with an unknown key": "[[orgs]]\nid = 'a'\napi_key = 'k'\n",
    "api_keys as a bare string": "[[orgs]]\nid = 'a'\napi_keys = 'secret'\n",
    "an api_key_sha256 that is no digest": "[[orgs]]\nid = 'a'\napi_key_sha256 = ['abc']\n",
    "a key with an unknown role": (
        "[[orgs]]\nid = 'a'\n[[orgs.keys]]\nname = 'n'\nrole = 'root'\nkey = 'k'\n"
    ),
    "a key with both key and sha256": (
        "[[orgs]]\nid = 'a'\n[[orgs.keys]]\nname = 'n'\nrole = 'agent'\nkey = 'k'\n"
        f"sha256 = '{'0' * 64}'\n"
    ),
    "a key without a name": "[[orgs]]\nid = 'a'\n[[orgs.keys]]\nrole = 'agent'\nkey = 'k'\n",
    "one key in two orgs": (
        "[[orgs]]\nid = 'a'\napi_keys = ['k']\n"
        "[[orgs]]\nid = 'b'\n[[orgs.keys]]\nname = 'n'\nrole = 'admin'\nkey = 'k'\n"
    ),
    "an approval timeout that is text": "[[orgs]]\nid = 'a'\napproval_timeout_seconds = '1h'\n",
    "auto-approve as text": "[[orgs]]\nid = 'a'\nauto_approve_on_timeout = 'false'\n",
    "orgs as a table": "[orgs]\nid = 'a'\n",
    "a tool without tier": "[[tools]]\norg = 'a'\nname = 't'\n",
    "a tool with an unknown tier": "[[tools]]\norg = 'a'\nname = 't'\ntier = 'risky'\n",
    "a compensable tool without compensation": (
        "[[tools]]\norg = 'a'\nname = 't'\ntier = 'compensable'\n"
    ),
    "idempotent_upstream as text": (
        "[[tools]]\norg = 'a'\nname = 't'\ntier = 'safe'\nidempotent_upstream = 'no'\n"
    ),
    "a tool name with a slash": "[[tools]]\norg = 'a'\nname = 'a/b'\ntier = 'safe'\n",
    "a tool named ..": "[[tools]]\norg = 'a'\nname = '..'\ntier = 'safe'\n",
    "a tool upstream that is no string": (
        "[[tools]]\norg = 'a'\nname = 't'\ntier = 'safe'\nupstream = 1\n"
    ),
    "upstreams as a table": "[upstreams]\nname = 'a'\n",
    "an upstream without url": "[[upstreams]]\nname = 'a'\n",
    "an upstream with an unknown key": "[[upstreams]]\nname = 'a'\nurl = 'http://a'\nhost = 'a'\n",
    "an upstream orgs as a bare string": (
        "[[upstreams]]\nname = 'a'\nurl = 'http://a'\norgs = 'acme'\n"
    ),
    "an upstream with secret and secret_env": (
        "[[upstreams]]\nname = 'a'\nurl = 'http://a'\nsecret = 's'\nsecret_env = 'S'\n"
    ),
}


@pytest.mark.parametrize("text", BAD_TOML.values(), ids=BAD_TOML.keys())
def test_a_bad_config_file_is_a_value_error_naming_the_file(
    write_toml: WriteToml, text: str
) -> None:
    config = write_toml(text)
    with pytest.raises(ValueError) as raised:
        load(config)
    assert config in str(raised.value)


def test_a_missing_config_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        load(str(tmp_path / "nope.toml"))


@pytest.mark.parametrize(
    "name", ["UNDOLOG_PORT", "UNDOLOG_LEASE_SECONDS", "UNDOLOG_MAX_BODY_BYTES"]
)
def test_a_bad_number_in_env_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError):
        load(env={name: "lots"})


def test_a_bad_number_as_a_flag_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load(port="eighty")


def test_an_unsupported_database_url_is_a_value_error_that_hides_the_password() -> None:
    with pytest.raises(ValueError) as raised:
        load(database_url="mysql://root:hunter2@db/undolog")
    assert "hunter2" not in str(raised.value)


# --- upstreams ---------------------------------------------------------------------------

UPSTREAMS_TOML = """
[[upstreams]]
name = "billing"
url = "https://billing.internal:8443/v2/"
secret = "s3cret-billing"
orgs = ["acme"]

[[upstreams]]
name = "shared"
url = "http://tools:8090"
secret_env = "SHARED_TOOLS_SECRET"

[[tools]]
org = "acme"
name = "refund"
tier = "irreversible"
upstream = "billing"

[[tools]]
org = "beta"
name = "lookup"
tier = "safe"
upstream = "shared"
"""


def test_upstreams_are_read_with_their_secrets_and_orgs(write_toml: WriteToml) -> None:
    config = write_toml(UPSTREAMS_TOML)
    settings = load(config, env={"SHARED_TOOLS_SECRET": "from-env"})
    assert settings.upstreams == (
        UpstreamConfig("billing", "https://billing.internal:8443/v2/", "s3cret-billing", ("acme",)),
        UpstreamConfig("shared", "http://tools:8090", "from-env", ()),
    )
    assert [t.upstream for t in settings.tools] == ["billing", "shared"]
    assert "s3cret-billing" not in repr(settings)
    assert "from-env" not in repr(settings)


def test_the_default_upstream_secret_comes_from_env_and_is_not_shown() -> None:
    settings = load(env={"UNDOLOG_UPSTREAM_SECRET": "dflt-secret"})
    assert settings.upstream_secret == "dflt-secret"
    assert "dflt-secret" not in repr(settings)


def test_an_upstream_whose_secret_env_is_unset_is_an_error_naming_the_key(
    write_toml: WriteToml,
) -> None:
    config = write_toml(UPSTREAMS_TOML)
    with pytest.raises(ValueError, match=r"upstreams\[1\]\.secret_env.*SHARED_TOOLS_SECRET"):
        load(config)


BAD_UPSTREAM_URLS = {
    "no scheme": "127.0.0.1:8090",
    "a file URL": "file:///etc/passwd",
    "a gopher URL": "gopher://127.0.0.1:6379/_",
    "user and password": "http://user:pw@127.0.0.1:8090",
    "a user only": "http://admin@tools",
    "a query": "http://127.0.0.1:9090/metrics?",
    "a query with text": "http://tools/x?y=1",
    "a fragment": "http://127.0.0.1:9090/anything#",
    "no host": "http:///tools",
    "a port that is no number": "http://tools:eighty",
    "a space": "http://tools /x",
}


@pytest.mark.parametrize("url", BAD_UPSTREAM_URLS.values(), ids=BAD_UPSTREAM_URLS.keys())
def test_a_bad_upstream_url_is_refused_at_load_naming_the_key(
    write_toml: WriteToml, url: str
) -> None:
    config = write_toml(f"[[upstreams]]\nname = 'u'\nurl = '{url}'\nsecret = 'x'\n")
    with pytest.raises(ValueError, match=r"upstreams\[0\]\.url") as raised:
        load(config)
    assert "pw" not in str(raised.value)


@pytest.mark.parametrize("url", BAD_UPSTREAM_URLS.values(), ids=BAD_UPSTREAM_URLS.keys())
def test_a_bad_upstream_url_setting_is_refused_without_echoing_it(url: str) -> None:
    with pytest.raises(ValueError, match="upstream_url") as raised:
        load(upstream_url=url)
    assert url not in str(raised.value)


def test_a_tool_with_an_upstream_url_is_refused_with_how_to_name_one(
    write_toml: WriteToml,
) -> None:
    config = write_toml(
        "[[tools]]\norg = 'a'\nname = 't'\ntier = 'safe'\nupstream_url = 'http://x'\n"
    )
    with pytest.raises(ValueError, match=r"upstream_url is no longer accepted.*\[\[upstreams\]\]"):
        load(config)


def test_a_tool_naming_an_unknown_upstream_is_refused(write_toml: WriteToml) -> None:
    config = write_toml("[[tools]]\norg = 'a'\nname = 't'\ntier = 'safe'\nupstream = 'nope'\n")
    with pytest.raises(ValueError, match=r"tools\[0\]\.upstream: no upstream named 'nope'"):
        load(config)


def test_a_tool_naming_an_upstream_closed_to_its_org_is_refused(write_toml: WriteToml) -> None:
    config = write_toml(UPSTREAMS_TOML.replace('upstream = "shared"', 'upstream = "billing"'))
    with pytest.raises(
        ValueError, match=r"tools\[1\]\.upstream: .*'billing' is not open to org 'beta'"
    ):
        load(config, env={"SHARED_TOOLS_SECRET": "x"})


def test_an_upstream_may_not_take_the_default_name(write_toml: WriteToml) -> None:
    config = write_toml("[[upstreams]]\nname = 'default'\nurl = 'http://x'\n")
    with pytest.raises(ValueError, match=r"upstreams\[0\]\.name"):
        load(config)


def test_an_upstream_declared_twice_is_refused(write_toml: WriteToml) -> None:
    config = write_toml(
        "[[upstreams]]\nname = 'a'\nurl = 'http://x'\n[[upstreams]]\nname = 'a'\nurl = 'http://y'\n"
    )
    with pytest.raises(ValueError, match="declared twice"):
        load(config)


def test_tool_names_in_the_mcp_gateway_style_are_accepted(write_toml: WriteToml) -> None:
    config = write_toml(
        "[[tools]]\norg = 'a'\nname = 'git.git_create_branch'\ntier = 'safe'\n"
        "[[tools]]\norg = 'a'\nname = 'ns:tool-v2'\ntier = 'safe'\n"
    )
    assert [t.name for t in load(config).tools] == ["git.git_create_branch", "ns:tool-v2"]


def test_connection_caps_come_from_toml_env_and_flags(write_toml: WriteToml) -> None:
    config = write_toml(
        "[server]\nmax_header_bytes = 1000\nheader_timeout_seconds = 2.5\n"
        "keep_alive_timeout_seconds = 3\nmax_connections = 50\nready_timeout_seconds = 0.5\n"
    )
    settings = load(config, env={"UNDOLOG_MAX_CONNECTIONS": "60"}, header_timeout_seconds=4)
    assert settings.max_header_bytes == 1000  # TOML
    assert settings.header_timeout_seconds == 4.0  # flag
    assert settings.keep_alive_timeout_seconds == 3.0
    assert settings.max_connections == 60  # env
    assert settings.ready_timeout_seconds == 0.5


def test_connection_caps_default_to_the_named_constants() -> None:
    settings = load()
    assert settings.max_header_bytes == config_module.DEFAULT_MAX_HEADER_BYTES
    assert settings.header_timeout_seconds == config_module.DEFAULT_HEADER_TIMEOUT_SECONDS
    assert settings.keep_alive_timeout_seconds == config_module.DEFAULT_KEEP_ALIVE_TIMEOUT_SECONDS
    assert settings.max_connections == config_module.DEFAULT_MAX_CONNECTIONS
    assert settings.ready_timeout_seconds == config_module.DEFAULT_READY_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    "name",
    [
        "UNDOLOG_MAX_HEADER_BYTES",
        "UNDOLOG_HEADER_TIMEOUT_SECONDS",
        "UNDOLOG_KEEP_ALIVE_TIMEOUT_SECONDS",
        "UNDOLOG_MAX_CONNECTIONS",
        "UNDOLOG_READY_TIMEOUT_SECONDS",
        "UNDOLOG_DB_POOL_SIZE",
    ],
)
def test_a_connection_cap_of_zero_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="greater than 0"):
        load(env={name: "0"})


def test_an_orgs_rules_are_read_from_its_section_and_none_means_keep_the_stored(
    write_toml: WriteToml,
) -> None:
    settings = load(
        write_toml(
            '[[orgs]]\nid = "a"\n[[orgs.rules]]\nname = "small"\ntool = "pay"\n'
            'condition = "amount < 100"\naction = "approve"\n[[orgs]]\nid = "b"\n'
        )
    )
    first, second = settings.orgs
    assert first.rules == (
        {"name": "small", "tool": "pay", "condition": "amount < 100", "action": "approve"},
    )
    assert second.rules is None
    with pytest.raises(ValueError, match="rules"):
        load(write_toml('[[orgs]]\nid = "a"\nrules = "amount < 1"\n'))


async def test_a_bad_rule_in_the_config_stops_the_start(store_url: str) -> None:
    from undolog.config import OrgConfig
    from undolog.runtime import open_runtime

    bad = OrgConfig(org_id="a", rules=({"name": "x", "condition": "amount <", "action": "deny"},))
    settings = Settings(database_url=store_url, orgs=(bad,))
    with pytest.raises(ValueError, match=r"rules\[0\].condition"):
        await open_runtime(settings)
