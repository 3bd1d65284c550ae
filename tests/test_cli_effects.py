"""`undolog effects resolve` against a real proxy on a loopback port, on both stores, and the
launcher's routing of the client commands (they load nothing of the server's CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from typer.testing import CliRunner, Result

from tests.proxy import conftest as proxy_fixtures
from tests.proxy.conftest import ProxyHarness
from undolog.cli import app

# The proxy harness's fixtures (tests/proxy/conftest.py), used here by name.
demo_upstream = proxy_fixtures.demo_upstream
proxy_factory = proxy_fixtures.proxy_factory
proxy = proxy_fixtures.proxy


def undolog(proxy: ProxyHarness, *args: str) -> Result:
    env = {"UNDOLOG_PROXY_URL": proxy.url, "UNDOLOG_API_KEY": proxy.api_key}
    return CliRunner().invoke(app, ["effects", *args], env=env)


def in_doubt_call(proxy: ProxyHarness) -> tuple[dict[str, object], str]:
    body = {"session_id": str(uuid.uuid4()), "tool_name": "broken", "step_index": 1, "args": {}}
    with proxy.client() as c:
        answer = c.post("/mcp/tool_call", json=body)
    assert answer.json()["code"] == "effect_in_doubt", answer.text
    effect_id: str = answer.json()["effect_id"]
    return body, effect_id


def test_resolving_as_committed_makes_the_retry_replay_the_given_result(
    proxy: ProxyHarness,
) -> None:
    body, effect_id = in_doubt_call(proxy)
    result = {"success": True, "output": {"checked": "by hand"}, "error": None}
    done = undolog(proxy, "resolve", effect_id, "--outcome", "committed",
                   "--result", json.dumps(result), "--json")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert (json.loads(done.stdout)["state"], json.loads(done.stdout)["result"]) == (
        "committed",
        result,
    )
    with proxy.client() as c:
        retry = c.post("/mcp/tool_call", json=body).json()
    assert (retry["status"], retry["result"]) == ("replayed", result)
    assert proxy.counters("broken") == {effect_id: 1}  # ran once, never again


def test_bad_input_is_refused_before_the_proxy_is_asked(proxy: ProxyHarness) -> None:
    _, effect_id = in_doubt_call(proxy)
    for args, message in [
        (["--outcome", "committed"], "--result"),
        (["--outcome", "committed", "--result", "{nope"], "--result is not JSON"),
        (["--outcome", "maybe"], "invalid choice"),
    ]:
        done = undolog(proxy, "resolve", effect_id, *args)
        assert (done.exit_code, done.stdout) == (2, ""), (args, done.output)
        assert message in done.stderr, (args, done.stderr)
    with proxy.client() as c:
        assert c.get(f"/effects/{effect_id}").json()["state"] == "in_doubt"


def test_an_agent_key_may_not_resolve(proxy: ProxyHarness) -> None:
    _, effect_id = in_doubt_call(proxy)
    env = {"UNDOLOG_PROXY_URL": proxy.url, "UNDOLOG_API_KEY": proxy.agent_key}
    done = CliRunner().invoke(
        app, ["effects", "resolve", effect_id, "--outcome", "failed"], env=env
    )
    assert done.exit_code == 1
    assert "forbidden" in done.stderr


def test_the_launcher_runs_client_commands_without_the_servers_cli() -> None:
    code = (
        "import sys; from undolog import _entry; sys.argv = ['undolog', *sys.argv[1:]]\n"
        "try:\n    _entry.main()\nexcept SystemExit as exit:\n"
        "    print(exit.code, sorted(m for m in ('typer', 'fastapi', 'undolog.cli') "
        "if m in sys.modules), file=sys.stderr)\n"
    )
    for args, stdout in [(["--version"], "undolog "), (["effects", "--help"], "usage: undolog")]:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
        )
        assert done.stdout.startswith(stdout), done
        assert done.stderr.strip().splitlines()[-1] == "0 []", done.stderr
