"""deploy/systemd/undolog.service: parsed as INI for the keys that matter, and verified by
`systemd-analyze verify` where it is installed (with the unit's executable pointed at this
environment's `undolog`, since /opt/undolog does not exist here)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "undolog.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text(encoding="utf-8"))
    return parser


def test_the_unit_migrates_then_serves_unprivileged() -> None:
    unit = _unit()
    service = unit["Service"]
    assert service["ExecStartPre"].endswith("undolog migrate")
    assert service["ExecStart"].endswith("undolog serve")
    assert service["User"] == "undolog"
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"  # a bad config is not retried forever
    assert service["NoNewPrivileges"] == "true"
    assert service["ProtectSystem"] == "strict"
    assert service["StateDirectory"] == "undolog"
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.security
def test_secrets_come_from_a_file_not_the_unit() -> None:
    service = _unit()["Service"]
    assert service["EnvironmentFile"].startswith("/etc/undolog/")
    text = UNIT.read_text(encoding="utf-8")
    for name in ("UNDOLOG_DATABASE_URL=", "UNDOLOG_UPSTREAM_SECRET=", "UNDOLOG_UI_SECRET="):
        assert name not in text


def test_systemd_analyze_verifies_it(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    here = Path(sys.executable).parent / "undolog"
    if not here.exists():
        pytest.skip(f"no `undolog` console script beside {sys.executable}")
    copy = tmp_path / "undolog.service"
    copy.write_text(
        UNIT.read_text(encoding="utf-8").replace("/opt/undolog/bin/undolog", str(here)), "utf-8"
    )
    done = subprocess.run(
        [tool, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "undolog.service" not in done.stderr, done.stderr
