"""deploy/compose.yaml: parsed and checked for what an operator relies on (healthchecks, start
order, no secret in the file), and dry-run by Debian's podman-compose when it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from undolog.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVING = {"postgres", "undolog", "demo-tools", "prometheus", "grafana"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY", re.IGNORECASE)
PASSWORD_IN_URL = re.compile(r"://[^/@\s]+:[^/@\s]+@")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        return dict(item.split("=", 1) for item in raw)
    return {str(k): str(v) for k, v in raw.items()}


def test_every_service_is_there_and_observability_is_a_profile() -> None:
    services = _compose()["services"]
    assert set(services) == SERVING | {"migrate"}
    for name, service in services.items():
        expected = ["observability"] if name in {"prometheus", "grafana"} else None
        assert service.get("profiles") == expected, name
    assert "--workers" in services["undolog"]["command"]
    assert services["demo-tools"]["command"][0] == "demo-tools"
    assert "--inspect" not in services["demo-tools"]["command"]  # its state stays private


def test_long_running_services_have_healthchecks_and_start_in_order() -> None:
    services = _compose()["services"]
    for name in SERVING:
        test = services[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
    assert "healthcheck" not in services["migrate"]  # it exits
    for name, service in services.items():
        for dependency, how in service.get("depends_on", {}).items():
            wanted = "service_healthy"
            if dependency == "migrate":
                wanted = "service_completed_successfully"
            assert how == {"condition": wanted}, (name, dependency)
    assert set(services["undolog"]["depends_on"]) == {"migrate", "demo-tools"}
    assert set(services["migrate"]["depends_on"]) == {"postgres"}
    # Only the migrate service migrates: the server checks the schema and refuses an old one.
    assert services["migrate"]["command"] == ["migrate"]
    assert _env(services["undolog"])["UNDOLOG_MIGRATE"] == "false"


@pytest.mark.security
def test_no_secret_is_written_in_the_file() -> None:
    compose = _compose()
    for name, service in compose["services"].items():
        for key, value in _env(service).items():
            if SECRET_NAME.search(key):
                assert key.endswith("_FILE") and value.startswith("/run/secrets/"), (name, key)
            assert not PASSWORD_IN_URL.search(value), (name, key)
        for env_file in service.get("env_file", []):
            # The real file is the operator's (git-ignored); the example has placeholders only.
            example = (DEPLOY / f"{env_file}.example").read_text(encoding="utf-8")
            for line in example.splitlines():
                if line and not line.startswith("#") and SECRET_NAME.search(line.split("=")[0]):
                    assert "CHANGE_ME" in line, line
    for secret in compose["secrets"].values():
        assert set(secret) == {"file"}
    ignored = (DEPLOY.parent / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert {"deploy/undolog.env", "deploy/*.txt"} <= set(ignored)


def test_mounted_files_exist_and_the_config_loads() -> None:
    services = _compose()["services"]
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source
    settings = load_settings({"config": str(DEPLOY / "undolog.toml")}, env={})
    assert [org.org_id for org in settings.orgs] == ["acme"]
    # Prometheus scrapes each worker's metrics port (--metrics-port P: P .. P + workers - 1).
    undolog = services["undolog"]
    workers = int(undolog["command"][undolog["command"].index("--workers") + 1])
    port = int(_env(undolog)["UNDOLOG_METRICS_PORT"])
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text("utf-8"))
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == [f"undolog:{port + i}" for i in range(workers)]


def test_podman_compose_accepts_it(tmp_path: Path) -> None:
    """Debian's podman-compose (1.0.3 in bookworm: no `config` command, no profiles) reads the
    file and prints the commands it would run (`--dry-run`)."""
    tool = shutil.which("podman-compose")
    if tool is None:
        pytest.skip("podman-compose is not installed (apt-get install podman-compose)")
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    shutil.copy(copy / "undolog.env.example", copy / "undolog.env")
    for name in ("postgres-password.txt", "grafana-admin-password.txt"):
        (copy / name).write_text("not-a-real-secret", encoding="utf-8")
    done = subprocess.run(
        [tool, "--dry-run", "-f", "compose.yaml", "up", "-d", "--no-build"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for service in SERVING:
        assert f"--name=deploy_{service}_1" in done.stdout, service
    assert "--env-file" in done.stdout and "UNDOLOG_MIGRATE=false" in done.stdout
