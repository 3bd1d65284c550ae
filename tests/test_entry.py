"""The `undolog` console script's launcher (undolog._entry): one line and exit 2 where the
server cannot run, instead of a traceback. The real installs are in tests/test_packaging.py;
here the two conditions are simulated in process."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from undolog import _entry


def _fails(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        _entry.main()
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    return line


def test_on_python_3_10_the_server_refuses_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    line = _fails(capsys)
    assert "needs Python 3.11 or newer (this is 3.10)" in line


def test_without_the_server_extra_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "uvicorn" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    line = _fails(capsys)
    assert "pip install 'undolog[server]'" in line and "'uvicorn'" in line


def test_every_server_dependency_is_checked() -> None:
    assert _entry.missing_server_dependency() is None  # the dev install has the server


def test_the_launcher_checks_exactly_the_server_extras_packages() -> None:
    """A dependency added to `undolog[server]` is one the launcher checks too."""
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["server"]
    names = {re.split(r"[<>=!~ ;\[]", requirement)[0].replace("-", "_") for requirement in extra}
    assert names == set(_entry.SERVER_MODULES)
