"""What `undolog serve` checks before it writes anything: one clear line per problem.

A start that cannot succeed must not leave traces (a demo key printed and stored, orgs and
tools seeded) nor a pile of tracebacks. So, before the demo is seeded and before the store is
written, `check_start` makes sure that:

- every address the process will listen on is free (the proxy, the demo tool server, the
  separate /metrics listener), and no two of them are the same;
- every stdio upstream of the `[mcp]` table names a command that exists;
- the spool folder (`--spool-dir`) can be written and fsync'd;
- the TLS certificate and key (`--ssl-certfile`, `--ssl-keyfile`) load as a pair;
- every `[[tools]]` entry names an org that is declared in `[[orgs]]` (or is the demo org) or
  already exists in the database.

It raises `StartProblem` with the message; the CLI prints `error: cannot start: <message>` and
exits 2. The same org check runs again inside the server's start-up (`open_runtime`) for
settings built in code.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path

from undolog.config import DEFAULT_HOST, Settings
from undolog.services.held import spool_problem

__all__ = ["StartProblem", "check_start", "missing_command", "port_problem", "tls_problem"]


class StartProblem(Exception):
    """A reason the server cannot start, said in one line."""


async def check_start(
    settings: Settings, *, demo_org: str | None = None, demo_tools_port: int | None = None
) -> None:
    """Raise `StartProblem` for the first problem found; write nothing."""
    listeners = [("the proxy", settings.host, settings.port)]
    if demo_tools_port is not None:
        listeners.append(("the demo tool server", DEFAULT_HOST, demo_tools_port))
    if settings.metrics_port is not None:
        listeners.append(("the /metrics listener", settings.metrics_host, settings.metrics_port))
    seen: dict[int, str] = {}
    for what, host, port in listeners:
        if port in seen:
            raise StartProblem(f"{what} and {seen[port]} are both given port {port}")
        seen[port] = what
        problem = port_problem(host, port)
        if problem:
            raise StartProblem(f"{what} cannot listen on {host}:{port}: {problem}")
    for upstream in settings.mcp.upstreams:
        if upstream.transport == "stdio" and upstream.command is not None:
            missing = missing_command(upstream.command, upstream.env, upstream.cwd)
            if missing:
                raise StartProblem(
                    f"[mcp] upstream {upstream.name!r}: command {upstream.command!r} {missing}"
                )
    problem = spool_problem(settings.spool_dir)
    if problem:
        raise StartProblem(
            f"the spool folder {settings.spool_dir} cannot be written: {problem} (--spool-dir: "
            "results held while the store is away are written there)"
        )
    problem = tls_problem(settings.ssl_certfile, settings.ssl_keyfile)
    if problem:
        raise StartProblem(problem)
    await _check_tool_orgs(settings, demo_org)


def tls_problem(certfile: str | None, keyfile: str | None) -> str | None:
    """Why the certificate and key cannot serve TLS (unreadable, not PEM, not a pair), or None.
    The files' content is never echoed."""
    if certfile is None:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return (
            f"TLS: the certificate {certfile} and key {keyfile or certfile} cannot be loaded "
            f"({reason}): PEM files, the key matching the certificate, are needed"
        )
    return None


def port_problem(host: str, port: int) -> str | None:
    """Why (host, port) cannot be listened on (bound as uvicorn binds), or None."""
    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r} ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return (exc.strerror or str(exc)).lower()
    return None


def missing_command(
    command: str, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> str | None:
    """Why a stdio upstream's command cannot be run, or None: a path must be an executable
    file; a bare name must be on PATH (the upstream's own PATH if its env sets one)."""
    if os.sep in command:
        path = Path(command)
        if not path.is_absolute() and cwd:
            path = Path(cwd) / path
        if not path.is_file():
            return "does not exist"
        if not os.access(path, os.X_OK):
            return "is not executable"
        return None
    search = env.get("PATH") if env else None
    if shutil.which(command, path=search) is None:
        return "is not found on PATH"
    return None


async def _check_tool_orgs(settings: Settings, demo_org: str | None) -> None:
    declared = {org.org_id for org in settings.orgs}
    if demo_org is not None:
        declared.add(demo_org)
    if all(tool.org_id in declared for tool in settings.tools):
        return  # nothing to look up: no store is opened
    from undolog.runtime import ensure_schema, unknown_tool_org
    from undolog.store import open_store
    from undolog_sdk.errors import UndoLogError

    try:
        store = await open_store(settings.database_url)
        try:
            # The schema only, so the lookup can run on a new database.
            await ensure_schema(store, migrate=settings.migrate)
            problem = await unknown_tool_org(store, settings, declared)
        finally:
            await store.close()
    except UndoLogError as exc:
        raise StartProblem(str(exc)) from None
    except ValueError as exc:  # the schema is behind and migrations at start are off
        raise StartProblem(str(exc)) from None
    if problem:
        raise StartProblem(problem)
