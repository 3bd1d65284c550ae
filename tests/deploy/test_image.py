"""deploy/Containerfile, built and run: the image CI ships.

No container registry is reachable here, so the base image is made from Debian's packages
(`debootstrap`: bookworm with python3 and python3-venv, the machine's CA bundle so that pip
inside the build trusts the same proxy the machine does) and handed to the build as
`BASE_IMAGE`; it is cached in the machine's container storage under a tag derived from its
recipe, so only the first run pays for it. The image is built with `buildah bud --isolation
chroot` (this sandbox refuses the OCI runtime's cgroups and rlimits, so `podman run` cannot
start a container): the smoke test runs the image's own filesystem with `buildah run`, as the
image's user, on the host's network — `undolog migrate`, then `undolog serve` answering
`/health`, `/ready` and a tool call against the host's PostgreSQL.

Skips, saying why, where buildah/podman/debootstrap are missing or the caller is not root;
under CI (`CI` set) it fails instead: CI must build the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.proxy.conftest import write_org_config
from tests.support.servers import ProcessServer, free_port, undolog_command, wait_until
from undolog.demo.catalog import DEMO_TOOLS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = "python3,python3-venv"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
IMAGE_USER = "10001:10001"
SIZE_GUARD_MB = 450  # a regression guard (base ~176 MB + the venv), not a target
DEADLINE = 120.0


def _missing() -> str | None:
    for tool in ("buildah", "podman", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install podman buildah debootstrap)"
    if os.geteuid() != 0:
        return "building a base with debootstrap needs root"
    return None


def _run(*args: str, timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, check=True, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def _base_tag() -> str:
    """The base's tag: a digest of its recipe and of the CA bundle it carries."""
    recipe = f"{SUITE} {MIRROR} {PACKAGES} minbase".encode()
    ca = HOST_CA.read_bytes() if HOST_CA.exists() else b""
    digest = hashlib.sha256(recipe + b"\0" + ca).hexdigest()[:16]
    return f"localhost/undolog-test-base:{SUITE}-{digest}"


def _ensure_base() -> str:
    tag = _base_tag()
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="undolog-base-") as work:
        rootfs = Path(work) / "rootfs"
        _run(
            "debootstrap", "--variant=minbase", f"--include={PACKAGES}", SUITE, str(rootfs),
            MIRROR,
        )  # fmt: skip
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        if HOST_CA.exists():  # pip in the build goes through the machine's proxy
            shutil.copyfile(HOST_CA, rootfs / "etc/ssl/certs/ca-certificates.crt")
            (rootfs / "etc/pip.conf").write_text(f"[global]\ncert = {HOST_CA}\n", encoding="utf-8")
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            _run("podman", "import", "-", tag, stdin=tar.stdout)
    return tag


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must build the image)")
        pytest.skip(reason)
    base = _ensure_base()
    tag = f"localhost/undolog:test-{uuid.uuid4().hex[:8]}"
    try:
        _run(
            "buildah", "bud", "--isolation", "chroot", "--format", "docker", "--layers",
            "-f", str(ROOT / "deploy" / "Containerfile"), "--build-arg", f"BASE_IMAGE={base}",
            "-t", tag, str(ROOT),
        )  # fmt: skip
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"the image did not build:\n{exc.stdout[-3000:]}\n{exc.stderr[-3000:]}")
    try:
        yield tag
    finally:
        subprocess.run(["podman", "rmi", "-f", tag], check=False, capture_output=True)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """A working container of the image, for `buildah run`."""
    name = _run("buildah", "from", "--name", f"undolog-test-{uuid.uuid4().hex[:8]}", image)
    ctr = name.stdout.strip()
    try:
        yield ctr
    finally:
        subprocess.run(["buildah", "rm", ctr], check=False, capture_output=True)


def _inspect(image: str) -> dict[str, Any]:
    [data] = json.loads(_run("podman", "image", "inspect", image).stdout)
    return dict(data)


def _in_image(container: str, *command: str, env: dict[str, str] | None = None,
              volumes: list[str] | None = None, user: str = IMAGE_USER) -> list[str]:  # fmt: skip
    args = ["buildah", "run", "--isolation", "chroot", "--network", "host", "--user", user]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    for volume in volumes or []:
        args += ["--volume", volume]
    return [*args, container, "--", *command]


def test_the_image_runs_undolog_serve_as_a_fixed_non_root_user(image: str) -> None:
    config = _inspect(image)["Config"]
    assert config["User"] == IMAGE_USER
    assert config["Entrypoint"] == ["undolog"]
    assert config["Cmd"] == ["serve"]
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Env"] and any(e.startswith("UNDOLOG_PORT=8080") for e in config["Env"])


def test_the_image_checks_its_health_on_health(image: str) -> None:
    health = _inspect(image)["Config"].get("Healthcheck") or _inspect(image).get("Healthcheck")
    assert health is not None, "the HEALTHCHECK was dropped (build with --format docker)"
    assert health["Test"][-1].endswith("undolog-healthcheck")
    script = (ROOT / "deploy" / "healthcheck.py").read_text(encoding="utf-8")
    assert "/health" in script


def test_the_image_has_no_compiler_and_reports_its_size(image: str, container: str) -> None:
    probe = subprocess.run(
        _in_image(container, "sh", "-c", "command -v gcc cc c++ clang make || echo none"),
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "none", probe.stdout
    size_mb = _inspect(image)["Size"] / 1e6
    print(f"\nimage {image}: {size_mb:.0f} MB")
    assert size_mb < SIZE_GUARD_MB


def test_the_image_migrates_then_serves_a_tool_call_against_postgresql(
    container: str, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)  # the image's user reads the mounted config
    api_key = "ul_image_" + uuid.uuid4().hex
    config = write_org_config(tmp_path / "undolog.toml", "org-image", api_key)
    config.chmod(0o644)
    upstream = ProcessServer(
        undolog_command("demo-tools", "--port", str(port := free_port())), env={}, port=port
    ).start()
    try:
        with fresh_pg_database("image") as database_url:
            env = {
                "UNDOLOG_DATABASE_URL": database_url,
                "UNDOLOG_UPSTREAM_URL": f"http://127.0.0.1:{port}",
                "UNDOLOG_CONFIG": "/etc/undolog/undolog.toml",
                "UNDOLOG_HOST": "127.0.0.1",
                "UNDOLOG_WORKERS": "1",
                "UNDOLOG_ALLOW_SELF_APPROVAL": "true",
            }
            volume = [f"{config}:/etc/undolog/undolog.toml:ro"]
            migrated = subprocess.run(
                _in_image(container, "undolog", "migrate", env=env, volumes=volume),
                capture_output=True, text=True, timeout=DEADLINE, check=False,
            )  # fmt: skip
            assert migrated.returncode == 0, migrated.stderr[-2000:]
            _serve_one_call(container, env, volume, api_key, tmp_path / "serve.log")
    finally:
        upstream.stop()


def _serve_one_call(
    container: str, env: dict[str, str], volume: list[str], key: str, log: Path
) -> None:
    port = free_port()
    env = {**env, "UNDOLOG_PORT": str(port)}
    with log.open("wb") as out:
        server = subprocess.Popen(
            _in_image(container, "undolog", "serve", env=env, volumes=volume),
            stdout=out, stderr=out,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            assert server.poll() is None, log.read_text(errors="replace")[-2000:]
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(answers, timeout=DEADLINE, what="undolog serve from the image to answer")
        assert httpx.get(url + "/ready", timeout=10).status_code == 200
        headers = {"X-Api-Key": key}
        registered = httpx.put(
            f"{url}/tools/echo", json=DEMO_TOOLS["echo"], headers=headers, timeout=30
        )
        assert registered.status_code == 200, registered.text
        body = {
            "session_id": str(uuid.uuid4()),
            "tool_name": "echo",
            "step_index": 1,
            "args": {"text": "from the image"},
        }
        first = httpx.post(f"{url}/mcp/tool_call", json=body, headers=headers, timeout=30)
        assert (first.status_code, first.json()["status"]) == (200, "executed"), first.text
        again = httpx.post(f"{url}/mcp/tool_call", json=body, headers=headers, timeout=30)
        assert (again.status_code, again.json()["status"]) == (200, "replayed"), again.text
        assert again.json()["result"] == first.json()["result"]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
