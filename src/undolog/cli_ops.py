"""Operator commands that talk to a running proxy: `undolog sessions ...`, `undolog undo ...`.

They use the REST API with the org's API key (`--api-key` / `UNDOLOG_API_KEY`) against
`--url` / `UNDOLOG_PROXY_URL` (default http://localhost:8080). Tables by default, `--json`
for machines. Exit codes: 0 done, 1 the proxy refused (its error is printed), 2 bad usage or
the proxy is unreachable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import typer

from undolog_sdk.wire import ApprovalStatus, RollbackOutcome

__all__ = ["approvals_app", "sessions_app", "undo_app"]

sessions_app = typer.Typer(add_completion=False, help="Inspect and roll back sessions.")
undo_app = typer.Typer(add_completion=False, help="Retry or resolve failed compensations.")

_URL = typer.Option(None, "--url", help="Proxy base URL (env UNDOLOG_PROXY_URL)")
_KEY = typer.Option(None, "--api-key", help="The org's API key (env UNDOLOG_API_KEY)")
_JSON = typer.Option(False, "--json", help="Print the raw JSON answer")
NONE = "none"  # what an empty table prints


def _request(method: str, url: str | None, api_key: str | None, path: str, body: Any = None) -> Any:
    base = url or os.environ.get("UNDOLOG_PROXY_URL") or "http://localhost:8080"
    key = api_key or os.environ.get("UNDOLOG_API_KEY")
    if not key:
        typer.echo("error: an API key is needed (--api-key or UNDOLOG_API_KEY)", err=True)
        raise typer.Exit(2)
    try:
        response = httpx.request(
            method, base.rstrip("/") + path, headers={"X-Api-Key": key}, json=body, timeout=120
        )
    except httpx.RequestError as exc:
        typer.echo(f"error: cannot reach the proxy at {base}: {exc}", err=True)
        raise typer.Exit(2) from None
    data = response.json() if response.content else None
    if response.status_code >= 400 and not (isinstance(data, dict) and "outcome" in data):
        message = data.get("message") if isinstance(data, dict) else response.text
        code = data.get("code") if isinstance(data, dict) else response.status_code
        typer.echo(f"error: {code}: {message}", err=True)
        raise typer.Exit(1)
    return data


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """Rows under their headers, or "none" when there are no rows."""
    if not rows:
        return NONE
    cells = [[str("" if v is None else v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)


def _print_json(data: Any) -> None:
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def render_session(data: dict[str, Any]) -> str:
    """A session as text: its state, the timeline of effects, the undo stack."""
    lines = [f"session {data['session_id']}  state={data['state']}", "", "effects (step order):"]
    rows = [
        [e["step_index"], e["tool_name"], e["tier"], e["state"], e["attempts"],
         e["replay_count"], e["error"] or ""]
        for e in data.get("effects", [])
    ]  # fmt: skip
    lines.append(_table(rows, ["step", "tool", "tier", "state", "attempts", "replays", "error"]))
    lines += ["", "undo stack (top first):"]
    undo = [
        [u["seq"], u["fn_name"], u["state"], u["attempts"], u["entry_id"], u["last_error"] or ""]
        for u in data.get("undo_stack", [])
    ]
    lines.append(_table(undo, ["seq", "compensation", "state", "attempts", "entry", "error"]))
    return "\n".join(lines)


@sessions_app.command("list")
def sessions_list(
    url: str = _URL, api_key: str = _KEY, as_json: bool = _JSON, limit: int = 50
) -> None:
    """Sessions of the org, most recently active first."""
    data = _request("GET", url, api_key, f"/sessions?limit={limit}")
    if as_json:
        _print_json(data)
        return
    rows = [[s["session_id"], s["state"], s["last_step"], s["updated_at"]] for s in data]
    typer.echo(_table(rows, ["session", "state", "last step", "updated"]))


@sessions_app.command("show")
def sessions_show(
    session_id: str, url: str = _URL, api_key: str = _KEY, as_json: bool = _JSON
) -> None:
    """A session's effects, undo stack and approvals."""
    data = _request("GET", url, api_key, f"/sessions/{session_id}")
    if as_json:
        _print_json(data)
        return
    typer.echo(render_session(data))


@sessions_app.command("rollback")
def sessions_rollback(
    session_id: str,
    entry: list[str] = typer.Option(
        None, "--entry", help="Undo only this undo entry (repeatable); the session stays open"
    ),
    after_step: int = typer.Option(
        None, "--after-step", help="Undo only the calls after this step; the session stays open"
    ),
    force: bool = typer.Option(
        False, "--force", help="Undo even if later calls that stay may depend on it"
    ),
    url: str = _URL,
    api_key: str = _KEY,
    as_json: bool = _JSON,
) -> None:
    """Unwind the session's undo stack, newest first (or only chosen entries: docs/undo.md)."""
    body: dict[str, Any] | None = None
    if entry or after_step is not None:
        body = {"force": force}
        if entry:
            body["entries"] = entry
        if after_step is not None:
            body["after_step"] = after_step
    data = _request("POST", url, api_key, f"/sessions/{session_id}/rollback", body)
    if as_json:
        _print_json(data)
    else:
        typer.echo(f"{'undo' if body else 'rollback'}: {data['outcome']}")
        if data.get("message"):
            typer.echo(data["message"])
        for dependent in data.get("dependents", []):
            typer.echo(
                f"warning: step {dependent['step_index']} {dependent['tool_name']} "
                f"({dependent['state']}) may depend on what was undone"
            )
        typer.echo(render_session(_request("GET", url, api_key, f"/sessions/{session_id}")))
    if data["outcome"] not in (RollbackOutcome.COMPENSATED, RollbackOutcome.EMPTY):
        raise typer.Exit(1)


@undo_app.command("retry")
def undo_retry(entry_id: str, url: str = _URL, api_key: str = _KEY, as_json: bool = _JSON) -> None:
    """Put a failed compensation back on the stack with fresh retries."""
    data = _request("POST", url, api_key, f"/undo/{entry_id}/retry")
    if as_json:
        _print_json(data)
        return
    typer.echo(f"entry {data['entry_id']} is {data['state']}; run `sessions rollback` to go on")


@undo_app.command("resolve")
def undo_resolve(
    entry_id: str,
    note: str = typer.Option(..., "--note", help="What was done by hand"),
    url: str = _URL,
    api_key: str = _KEY,
    as_json: bool = _JSON,
) -> None:
    """Mark a failed compensation as handled by hand."""
    data = _request("POST", url, api_key, f"/undo/{entry_id}/resolve", {"note": note})
    if as_json:
        _print_json(data)
        return
    typer.echo(f"entry {data['entry_id']} is {data['state']}; run `sessions rollback` to go on")


approvals_app = typer.Typer(add_completion=False, help="List, approve and reject approvals.")


def _approval_rows(records: list[dict[str, Any]], decided: bool) -> list[list[Any]]:
    rows = []
    for a in records:
        row = [a["id"], a["tool_name"], a["status"], a["session_id"], a["created_at"],
               a["timeout_at"], orjson.dumps(a.get("arguments")).decode()[:60]]  # fmt: skip
        if decided:  # who decided and why, as stored
            row += [a.get("decided_at"), a.get("decided_by"), a.get("reason")]
        rows.append(row)
    return rows


@approvals_app.command("list")
def approvals_list(
    state: str = typer.Option(
        ApprovalStatus.PENDING.value, "--state", help=", ".join(ApprovalStatus)
    ),
    limit: int = typer.Option(100, "--limit", help="1-500, newest first"),
    url: str = _URL,
    api_key: str = _KEY,
    as_json: bool = _JSON,
) -> None:
    """Approval requests of the org, newest first."""
    query = urlencode({"state": state, "limit": limit})
    data = _request("GET", url, api_key, f"/approvals?{query}")
    if as_json:
        _print_json(data)
        return
    headers = ["approval", "tool", "status", "session", "created", "timeout", "args"]
    decided = state != ApprovalStatus.PENDING
    if decided:
        headers += ["decided", "by", "reason"]
    typer.echo(_table(_approval_rows(data, decided), headers))


def _decide(action: str, approval_id: str, reason: str | None,
            url: str | None, api_key: str | None, as_json: bool,
            args: str | None = None, args_hash: str | None = None) -> None:  # fmt: skip
    # Who decides is the API key's name, recorded by the proxy: nothing to send for it.
    body: dict[str, Any] = {"reason": reason} if reason is not None else {}
    if args is not None:  # approve with changes (docs/approvals.md)
        try:
            body["args"] = orjson.loads(args)
        except orjson.JSONDecodeError as exc:
            raise typer.BadParameter(f"--args is not JSON: {exc}") from None
    if args_hash is not None:  # the arguments you saw (docs/approvals.md)
        body["args_hash"] = args_hash
    data = _request("POST", url, api_key, f"/approvals/{approval_id}/{action}", body)
    if as_json:
        _print_json(data)
        return
    line = f"approval {data['approval_id']}: {data['status']}"
    if data.get("execution") == "awaiting_approvers":
        line += f"; approvals {data.get('approvals')} of {data.get('approvers_required')}"
    elif "execution" in data:
        line += f"; execution {data['execution']}"
        if data.get("error"):
            line += f": {data['error']}"
    typer.echo(line)
    if data.get("result") is not None:
        typer.echo(orjson.dumps(data["result"], option=orjson.OPT_INDENT_2).decode())


@approvals_app.command("approve")
def approvals_approve(
    approval_id: str,
    reason: str = typer.Option(None, "--reason", help="Why (stored and shown)"),
    args: str = typer.Option(
        None, "--args", help="The call's arguments as changed by you (a JSON object)"
    ),
    args_hash: str = typer.Option(
        None,
        "--args-hash",
        help="The approval's args_hash as you saw it (`approvals list --json`): refused "
        "if another approver has changed the arguments since",
    ),
    url: str = _URL,
    api_key: str = _KEY,
    as_json: bool = _JSON,
) -> None:
    """Approve a pending request; a proxy-executed call runs now (with --args: those)."""
    _decide("approve", approval_id, reason, url, api_key, as_json, args, args_hash)


@approvals_app.command("reject")
def approvals_reject(
    approval_id: str,
    reason: str = typer.Option(None, "--reason", help="Why (stored and shown)"),
    url: str = _URL,
    api_key: str = _KEY,
    as_json: bool = _JSON,
) -> None:
    """Reject a pending request and halt its session."""
    _decide("reject", approval_id, reason, url, api_key, as_json)
