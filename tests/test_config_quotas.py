"""The key quota settings (issue 22): their defaults, each source (flag, env var, `[server]`),
and bad values refused at start with a message naming the setting."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.servers import undolog_command
from undolog.config import (
    DEFAULT_KEY_CALL_BURST,
    DEFAULT_KEY_CALLS_PER_SECOND,
    DEFAULT_KEY_EVENT_STREAMS,
    DEFAULT_KEY_SESSIONS_PER_MINUTE,
    Settings,
    load_settings,
)

pytestmark = pytest.mark.security

QUOTAS = ("key_calls_per_second", "key_call_burst", "key_sessions_per_minute", "key_event_streams")


def test_the_defaults_stop_a_flood_and_leave_people_streams() -> None:
    settings = load_settings({}, {})
    assert settings.key_calls_per_second == DEFAULT_KEY_CALLS_PER_SECOND == 50
    assert settings.key_call_burst == DEFAULT_KEY_CALL_BURST == 200
    assert settings.key_sessions_per_minute == DEFAULT_KEY_SESSIONS_PER_MINUTE == 120
    assert settings.key_event_streams == DEFAULT_KEY_EVENT_STREAMS == 10


def test_each_quota_is_read_from_toml_env_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "undolog.toml"
    config.write_text(
        "[server]\nkey_calls_per_second = 2.5\nkey_call_burst = 7\n"
        "key_sessions_per_minute = 30\nkey_event_streams = 3\n",
        encoding="utf-8",
    )
    settings = load_settings(
        {"config": str(config), "key_event_streams": 4},
        {"UNDOLOG_KEY_SESSIONS_PER_MINUTE": "31"},
    )
    assert (settings.key_calls_per_second, settings.key_call_burst) == (2.5, 7)
    assert settings.key_sessions_per_minute == 31  # env over TOML
    assert settings.key_event_streams == 4  # flag over env and TOML


@pytest.mark.parametrize("name", QUOTAS)
@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan", "inf"])
def test_a_bad_quota_is_refused_naming_the_setting(name: str, value: str) -> None:
    if value in ("nan", "inf") and Settings.__dataclass_fields__[name].type == "int":
        value = "1.5"  # an int setting refuses a fraction
    with pytest.raises(ValueError, match=name):
        load_settings({}, {f"UNDOLOG_{name.upper()}": value})


def test_a_fractional_burst_in_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "undolog.toml"
    config.write_text("[server]\nkey_call_burst = 2.5\n", encoding="utf-8")
    with pytest.raises(ValueError, match="key_call_burst"):
        load_settings({"config": str(config)}, {})


def test_serve_with_a_bad_quota_exits_before_starting_with_a_clear_message() -> None:
    result = subprocess.run(
        [*undolog_command("serve"), "--key-event-streams", "0"],
        env={k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: setting 'key_event_streams' must be greater than 0 (and finite)"
    )
