"""deploy/k8s: each overlay rendered by `kubectl kustomize` (offline) and checked for what a
platform team relies on. Skips, saying why, where kubectl is not installed."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(path.name for path in (K8S / "overlays").iterdir())
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]


@functools.cache
def _render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` renders the manifests")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def _one(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, (kind, [d["metadata"]["name"] for d in found])
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_there_is_a_dev_and_a_prod_overlay() -> None:
    assert OVERLAYS == ["dev", "prod"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_deployment_probes_limits_and_runs_unprivileged(overlay: str) -> None:
    docs = _render(overlay)
    deployment = _one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    for kind in ("requests", "limits"):
        assert set(container["resources"][kind]) == {"cpu", "memory"}
    # What is written lives on emptyDirs: the spool (--spool-dir) and /tmp.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    env = _env(container)
    assert "emptyDir" in volumes[mounts[env["UNDOLOG_SPOOL_DIR"]]]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "configMap" in volumes[mounts["/etc/undolog"]]
    assert env["UNDOLOG_CONFIG"].startswith("/etc/undolog/")
    assert env["UNDOLOG_MIGRATE"] == "false"  # only the Job migrates
    assert container["args"] == ["serve"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_have_their_own_port_and_service(overlay: str) -> None:
    docs = _render(overlay)
    (container,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = _env(container)
    assert ports["metrics"] == int(env["UNDOLOG_METRICS_PORT"]) != ports["http"]
    assert env["UNDOLOG_METRICS_HOST"] == "0.0.0.0"
    metrics = _one(docs, "Service", "undolog-metrics")
    assert [p["targetPort"] for p in metrics["spec"]["ports"]] == ["metrics"]
    main = _one(docs, "Service", "undolog")
    assert [p["targetPort"] for p in main["spec"]["ports"]] == ["http"]


@pytest.mark.security
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_referenced_never_written(overlay: str) -> None:
    docs = _render(overlay)
    assert not [d for d in docs if d["kind"] == "Secret"]
    for kind in ("Deployment", "Job"):
        (container,) = _one(docs, kind)["spec"]["template"]["spec"]["containers"]
        url = _env(container)["UNDOLOG_DATABASE_URL"]
        assert url == {"secretKeyRef": {"name": "undolog", "key": "database-url"}}
    for name, value in _env(
        _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    ).items():
        if re.search("SECRET|PASSWORD|TOKEN", name):
            assert "secretKeyRef" in value, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migration_job_is_named_for_this_release(overlay: str) -> None:
    docs = _render(overlay)
    job = _one(docs, "Job")
    assert job["metadata"]["name"] == "undolog-migrate-" + VERSION.replace(".", "-")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["migrate"]
    assert pod["restartPolicy"] in ("OnFailure", "Never")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    (server,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == server["image"]  # the same release migrates and serves


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pdb_and_hpa_select_the_servers(overlay: str) -> None:
    docs = _render(overlay)
    deployment = _one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"] or (
        pdb["spec"]["minAvailable"] == 0
    )
    hpa = _one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"]
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    for service in (d for d in docs if d["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= labels.items()


def test_the_overlays_differ_in_size_and_image() -> None:
    dev, prod = (_one(_render(o), "Deployment") for o in ("dev", "prod"))
    assert dev["spec"]["replicas"] < prod["spec"]["replicas"]
    dev_container = dev["spec"]["template"]["spec"]["containers"][0]
    prod_container = prod["spec"]["template"]["spec"]["containers"][0]
    assert dev_container["resources"] != prod_container["resources"]
    assert prod_container["image"].endswith(":" + VERSION)
    assert dev_container["image"] != prod_container["image"]
