"""The `undolog` distribution as people install it: a wheel, in fresh venvs, off the checkout.

The wheel is built from the repo root once, then installed (never editable) into two new
venvs run from a temporary working directory with no path to the checkout: one with the
`server` extra runs `undolog serve --demo` and makes a tool call; the other gets the default
install (the SDK alone) and checks what it depends on and what the `undolog` command says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import ProcessServer, free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 600.0  # a cold resolve of the server's dependencies from the local index


def _env(cwd: Path) -> dict[str, str]:
    """This environment without anything that points into the checkout or its venv."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNDOLOG_") and k not in dropped}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO))
    )
    env["HOME"] = env.get("HOME", str(cwd))
    return env


def _run(
    args: list[str], cwd: Path, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, cwd=cwd, env=_env(cwd), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check:
        assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        cwd=out,
        timeout=INSTALL_TIMEOUT,
    )
    (built,) = out.glob("undolog-*.whl")
    return built


class Venv:
    def __init__(self, root: Path, cwd: Path) -> None:
        self.root, self.cwd = root, cwd
        self.python = str(root / "bin" / "python")
        self.undolog = str(root / "bin" / "undolog")

    def run(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return _run([*args], self.cwd, **kwargs)  # type: ignore[arg-type]

    def py(self, code: str) -> str:
        return self.run(self.python, "-c", code).stdout


def _fresh_venv(tmp_path: Path, requirement: str) -> Venv:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    venv = Venv(tmp_path / "venv", cwd)
    _run([sys.executable, "-m", "venv", str(venv.root)], cwd)
    venv.run(venv.python, "-m", "pip", "install", "-q", requirement, timeout=INSTALL_TIMEOUT)
    # Nothing of the checkout is on the path: both packages come from site-packages.
    files = json.loads(
        venv.py(
            "import json, undolog, undolog_sdk; "
            "print(json.dumps([undolog.__file__, undolog_sdk.__file__]))"
        )
    )
    for file in files:
        assert str(venv.root) in file and str(REPO) not in file, files
        assert (Path(file).parent / "py.typed").is_file(), file
    return venv


@pytest.fixture
def servers() -> Iterator[list[ProcessServer]]:
    started: list[ProcessServer] = []
    yield started
    for server in reversed(started):
        server.stop()


def test_the_wheel_with_the_server_extra_serves_the_demo_in_a_fresh_venv(
    wheel: Path, tmp_path: Path, servers: list[ProcessServer]
) -> None:
    venv = _fresh_venv(tmp_path, f"{wheel}[server]")
    port, tools_port = free_port(), free_port()
    log = tmp_path / "serve.log"
    args = [venv.undolog, "serve", "--demo", "--port", str(port),
            "--demo-tools-port", str(tools_port),
            "--database-url", f"sqlite:///{tmp_path / 'demo.db'}"]  # fmt: skip
    server = ProcessServer(args, _env(venv.cwd), port, log_path=str(log))
    servers.append(server)
    server.start()
    found = re.search(r"export UNDOLOG_API_KEY=(\S+)", log.read_text(encoding="utf-8"))
    assert found, log.read_text(encoding="utf-8")
    body = {"session_id": str(uuid.uuid4()), "tool_name": "send_email", "step_index": 1,
            "args": {"to": "ada@example.com", "subject": "hi"}}  # fmt: skip
    answer = httpx.post(
        f"{server.url}/mcp/tool_call", json=body, headers={"X-Api-Key": found.group(1)}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "executed"
    assert venv.py("import undolog_sdk; print(undolog_sdk.UndoLogSession.__name__)").strip() == (
        "UndoLogSession"
    )
    version = venv.run(venv.undolog, "--version")
    assert version.stdout.strip() == "undolog 0.1.0"


def test_the_default_install_is_the_sdk_alone(wheel: Path, tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, str(wheel))
    requires = json.loads(
        venv.py("import importlib.metadata as m, json; print(json.dumps(m.requires('undolog')))")
    )
    unconditional = sorted(re.split(r"[<>=!~ ;\[]", r)[0] for r in requires if "extra ==" not in r)
    assert unconditional == ["blake3", "httpx"], requires
    assert "UndoLogSession" in venv.py("import undolog_sdk; print(dir(undolog_sdk))")
    # The server's dependencies are not there, and the command says how to get them.
    assert venv.py("import importlib.util as u; print(u.find_spec('fastapi'))").strip() == "None"
    for command in ([venv.undolog], [venv.undolog, "serve", "--demo"]):
        done = venv.run(*command, check=False)
        assert done.returncode == 2, done
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert "pip install 'undolog[server]'" in line
