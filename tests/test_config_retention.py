"""Retention settings (docs/retention.md): an org's `retention_days`, the sweep's interval and
batch size; read from the TOML file, env vars and flags like every setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from undolog.config import (
    DEFAULT_RETENTION_BATCH_SIZE,
    DEFAULT_RETENTION_SWEEP_SECONDS,
    MAX_RETENTION_BATCH_SIZE,
    load_settings,
)
from undolog.engine.retention import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE


def config(tmp_path: Path, org_lines: str) -> str:
    path = tmp_path / "undolog.toml"
    path.write_text(f'[[orgs]]\nid = "acme"\n{org_lines}', encoding="utf-8")
    return str(path)


def test_an_org_keeps_everything_unless_it_sets_retention_days(tmp_path: Path) -> None:
    assert load_settings({"config": config(tmp_path, "")}, env={}).orgs[0].retention_days is None
    settings = load_settings({"config": config(tmp_path, "retention_days = 30\n")}, env={})
    assert settings.orgs[0].retention_days == 30


@pytest.mark.parametrize("value", ["0", "-1", '"30"', "true", "1.5"])
def test_retention_days_must_be_a_whole_number_of_days(tmp_path: Path, value: str) -> None:
    path = config(tmp_path, f"retention_days = {value}\n")
    with pytest.raises(ValueError, match=r"orgs\[0\]\.retention_days"):
        load_settings({"config": path}, env={})


def test_the_sweep_interval_and_batch_size_have_defaults_env_vars_and_flags() -> None:
    defaults = load_settings({}, env={})
    assert defaults.retention_sweep_seconds == DEFAULT_RETENTION_SWEEP_SECONDS
    assert defaults.retention_batch_size == DEFAULT_RETENTION_BATCH_SIZE
    env = {"UNDOLOG_RETENTION_SWEEP_SECONDS": "30", "UNDOLOG_RETENTION_BATCH_SIZE": "50"}
    from_env = load_settings({}, env=env)
    assert (from_env.retention_sweep_seconds, from_env.retention_batch_size) == (30.0, 50)
    flagged = load_settings({"retention_batch_size": 7}, env=env)
    assert flagged.retention_batch_size == 7


@pytest.mark.parametrize("name", ["retention_sweep_seconds", "retention_batch_size"])
def test_the_sweep_settings_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        load_settings({name: 0}, env={})


def test_the_batch_size_is_bounded_as_the_engine_bounds_it() -> None:
    assert (MAX_RETENTION_BATCH_SIZE, DEFAULT_RETENTION_BATCH_SIZE) == (
        MAX_BATCH_SIZE,
        DEFAULT_BATCH_SIZE,
    )
    with pytest.raises(ValueError, match="retention_batch_size"):
        load_settings({"retention_batch_size": MAX_BATCH_SIZE + 1}, env={})
