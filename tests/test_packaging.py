"""The `undolog` distribution as people install it: a wheel, in fresh venvs, off the checkout.

The wheel is built from the repo root once, then installed (never editable) into two new
venvs run from a temporary working directory with no path to the checkout: one with the
`server` extra runs `undolog serve --demo` and makes a tool call; the other gets the default
install (the SDK alone) and checks what it depends on, what the `undolog` command says, and
that its client commands (`--version`, `approvals`, `effects resolve`, `sessions`) work
against a real proxy. The wheel's metadata (licence, classifiers, public extras) and the
sdist's files are read from the built archives.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from tests.support.servers import ProcessServer, free_port

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy

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


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, built by the declared build backend in a venv of its own (as `build` does)."""
    root = tmp_path_factory.mktemp("sdist")
    builder = Venv(root / "venv", root)
    _run([sys.executable, "-m", "venv", str(builder.root)], root)
    requires = ["hatchling>=1.27"]  # [build-system] requires
    builder.run(builder.python, "-m", "pip", "install", "-q", *requires, timeout=INSTALL_TIMEOUT)
    code = "import sys; from hatchling.build import build_sdist; print(build_sdist(sys.argv[1]))"
    name = _run([builder.python, "-c", code, str(root)], REPO).stdout.strip()
    return root / name


def _metadata(wheel: Path) -> Any:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode("utf-8"))


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


@pytest.fixture(scope="module")
def sdk_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The default install (the SDK alone) of the wheel, in a fresh venv."""
    return _fresh_venv(tmp_path_factory.mktemp("sdk"), str(wheel))


def test_the_default_install_is_the_sdk_alone(sdk_venv: Venv) -> None:
    venv = sdk_venv
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


def test_ci_and_contributing_run_the_readmes_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"Run the tests.*?```sh\n(.*?)\n```", readme, re.S)
    assert found, "the README's test command"
    command = found.group(1)
    assert "--group dev" in command and "-U pip" in command and "[dev]" not in command
    run_lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in run_lines
    assert command in (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    first = re.search(r"Run the product.*?```sh\n(.*?)\n```", readme, re.S)
    assert first and "-e '.[server]' &&" in first.group(1), "the run command installs the server"


def test_the_wheel_says_its_licence_and_publishes_no_development_extras(wheel: Path) -> None:
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    assert meta["Author"] == "UndoLog developers" or "UndoLog developers" in meta["Author-email"]
    assert "ai-agents" in meta["Keywords"]
    extras = set(meta.get_all("Provides-Extra"))
    assert {"server", "otel", "langgraph"} <= extras
    assert not extras & {"dev", "bench"}, extras  # dependency groups, not public extras
    with zipfile.ZipFile(wheel) as archive:
        (licence,) = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        text = archive.read(licence).decode("utf-8")
    assert "Apache License" in text and "TERMS AND CONDITIONS FOR USE" in text
    assert text == (REPO / "LICENSE").read_text(encoding="utf-8")


def test_the_sdist_holds_the_licence_and_the_changelog(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "docs/why.md"} <= names
    assert "src/undolog/cli_ops.py" in names and "sdk/src/undolog_sdk/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", ".ci/", "bench/"))]


def test_the_client_commands_work_without_the_server_extra(
    sdk_venv: Venv, proxy: ProxyHarness
) -> None:
    venv = sdk_venv
    metadata_version = venv.py("import importlib.metadata as m; print(m.version('undolog'))")
    version = venv.run(venv.undolog, "--version")
    assert version.stdout == f"undolog {metadata_version.strip()}\n", version
    assert venv.py("import undolog_sdk; print(undolog_sdk.__version__)") == metadata_version
    assert venv.py("import importlib.util as u; print(u.find_spec('typer'))").strip() == "None"
    remote = ("--url", proxy.url, "--api-key", proxy.api_key)

    def undolog(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return venv.run(venv.undolog, *args, *remote, check=check)

    session = str(uuid.uuid4())
    drop = {"session_id": session, "tool_name": "delete_database", "step_index": 1,
            "args": {"db_name": "db-1"}}  # fmt: skip
    broken = {"session_id": session, "tool_name": "broken", "step_index": 2, "args": {}}
    with proxy.client() as c:
        asked = c.post("/mcp/tool_call", json=drop)
        assert asked.status_code == 202, asked.text
        in_doubt = c.post("/mcp/tool_call", json=broken)
        assert in_doubt.json()["code"] == "effect_in_doubt", in_doubt.text
    approval_id, effect_id = asked.json()["approval_id"], in_doubt.json()["effect_id"]

    (listed,) = json.loads(undolog("approvals", "list", "--json").stdout)
    assert (listed["id"], listed["args"]) == (approval_id, {"db_name": "db-1"})
    table = undolog("approvals", "list").stdout
    assert approval_id in table and '{"db_name":"db-1"}' in table
    approved = undolog("approvals", "approve", approval_id, "--reason", "checked")
    assert approved.stdout.splitlines()[0] == (
        f"approval {approval_id}: approved; execution committed"
    )

    # An in-doubt call, settled by hand: who resolved it is on record.
    no_result = undolog("effects", "resolve", effect_id, "--outcome", "committed", check=False)
    assert (no_result.returncode, no_result.stdout) == (2, "")
    assert "--result" in no_result.stderr
    resolved = undolog("effects", "resolve", effect_id, "--outcome", "failed",
                       "--error", "it never reached the bank")  # fmt: skip
    assert resolved.stdout.startswith(f"effect {effect_id}: failed: it never reached the bank")
    with proxy.client() as c:
        effect = c.get(f"/effects/{effect_id}").json()
    assert effect["state"] == "failed"
    assert effect["error"] == "it never reached the bank (resolved by key:admin)"
    again = undolog("effects", "resolve", effect_id, "--outcome", "failed", check=False)
    assert again.returncode == 1 and "invalid_state_transition" in again.stderr, again

    shown = undolog("sessions", "show", session).stdout
    assert "delete_database" in shown and "broken" in shown
    help_text = venv.run(venv.undolog, "effects", "resolve", "--help").stdout
    assert "--outcome {committed,failed}" in help_text
