"""deploy/Containerfile, read statically (tests/deploy/test_image.py builds and runs it): two
stages, the base image a build argument defaulting to an official slim Python 3.11, a non-root
final stage with no compiler, `undolog serve` by default, `undolog migrate` runnable alone, a
HEALTHCHECK."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPILERS = re.compile(r"\b(gcc|g\+\+|clang|cc|build-essential|make|python3?-dev|libc6?-dev)\b")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Containerfile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    pairs = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_the_base_image_is_an_argument_defaulting_to_official_slim_python() -> None:
    before_from = [i for i in _instructions()[:1] if i[0] == "ARG"]
    assert before_from, "ARG BASE_IMAGE must come before the first FROM"
    name, _, default = before_from[0][1].partition("=")
    assert name == "BASE_IMAGE"
    assert re.fullmatch(r"(docker\.io/library/)?python:3\.11[.\d]*-slim(-\w+)?", default)
    stages = _stages()
    assert len(stages) >= 2
    for stage in stages:
        assert stage[0][1].split()[0] == "${BASE_IMAGE}"


def test_the_final_stage_runs_unprivileged_without_compilers() -> None:
    final = _stages()[-1]
    users = [args for word, args in final if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0].isdigit()  # numeric: runAsNonRoot can check it
    for word, args in final:
        if word == "RUN":
            assert not COMPILERS.search(args), args
            assert "apt-get install" not in args and "pip install" not in args, args
    copies = [args for word, args in final if word == "COPY"]
    assert any(c.startswith("--from=") for c in copies)  # the venv, built in the first stage


def test_it_serves_by_default_and_can_migrate_alone() -> None:
    final = dict(_stages()[-1])
    entrypoint, command = json.loads(final["ENTRYPOINT"]), json.loads(final["CMD"])
    assert entrypoint + command == ["undolog", "serve"]
    assert entrypoint == ["undolog"]  # so `<image> migrate` runs `undolog migrate`
    env = dict(item.split("=", 1) for item in shlex.split(final["ENV"]) if "=" in item)
    assert env["UNDOLOG_HOST"] == "0.0.0.0"
    assert env["UNDOLOG_DATABASE_URL"].startswith("sqlite:////var/lib/undolog/")
    assert "/opt/undolog/bin" in env["PATH"]


def test_the_healthcheck_asks_health(tmp_path: Path) -> None:
    final = dict(_stages()[-1])
    check = final["HEALTHCHECK"]
    assert "CMD" in check
    assert "undolog-healthcheck" in check
    script = (DEPLOY / "healthcheck.py").read_text(encoding="utf-8")
    assert "/health" in script
    # Nothing listens on this port: the check says unhealthy (exit 1), quickly, no traceback.
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "healthcheck.py")],
        env={"UNDOLOG_PORT": "1"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stderr) == (1, "")


@pytest.mark.parametrize("path", ["pyproject.toml", "README.md", "LICENSE", "src", "sdk"])
def test_what_it_copies_exists(path: str) -> None:
    assert (DEPLOY.parent / path).exists()
    assert path in (DEPLOY / "Containerfile").read_text(encoding="utf-8")
