"""The client commands: `undolog sessions|approvals|undo|effects ...` and `undolog --version`.

They talk to a running proxy over its REST API with the org's API key (`--api-key` /
`UNDOLOG_API_KEY`) at `--url` / `UNDOLOG_PROXY_URL` (default http://localhost:8080). Tables by
default, `--json` for machines. Exit codes: 0 done, 1 the proxy refused (its error is
printed), 2 bad usage or the proxy is unreachable.

They need only what the default install has (the standard library, httpx and the SDK), so
they work without the `server` extra and on Python 3.10: the console script's launcher
(`undolog._entry`) runs them straight from here, with the server's typer CLI
(`undolog.cli`) only listing them. This module must import nothing of the server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn
from urllib.parse import quote, urlencode

import httpx

from undolog_sdk.wire import ApprovalStatus, EffectState, RollbackOutcome

__all__ = ["COMMANDS", "main", "render_session", "version"]

NONE = "none"  # what an empty table prints
DEFAULT_URL = "http://localhost:8080"
# The top-level commands served here (the launcher routes them without the server's CLI).
COMMANDS = {
    "sessions": "Inspect and roll back sessions.",
    "approvals": "List, approve and reject approvals.",
    "undo": "Retry or resolve failed compensations.",
    "effects": "Resolve calls left in doubt.",
}


def version() -> str:
    """The installed distribution's version (pyproject's `version`)."""
    from undolog_sdk import __version__

    return __version__


class _Failed(Exception):
    """Ends a command with an exit code after its message is printed to stderr."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _echo(text: str) -> None:
    print(text, file=sys.stdout)


def _request(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    base = args.url or os.environ.get("UNDOLOG_PROXY_URL") or DEFAULT_URL
    key = args.api_key or os.environ.get("UNDOLOG_API_KEY")
    if not key:
        raise _Failed(2, "an API key is needed (--api-key or UNDOLOG_API_KEY)")
    try:
        response = httpx.request(
            method, base.rstrip("/") + path, headers={"X-Api-Key": key}, json=body, timeout=120
        )
    except httpx.RequestError as exc:
        raise _Failed(2, f"cannot reach the proxy at {base}: {exc}") from None
    try:
        data = response.json() if response.content else None
    except ValueError:  # not JSON: not an UndoLog proxy, or a proxy in front of it failing
        raise _Failed(
            1 if response.status_code >= 400 else 2,
            f"{response.status_code}: the answer from {base} is not JSON",
        ) from None
    if response.status_code >= 400 and not (isinstance(data, dict) and "outcome" in data):
        message = data.get("message") if isinstance(data, dict) else None
        code = data.get("code") if isinstance(data, dict) else None
        raise _Failed(1, f"{code or response.status_code}: {message or response.reason_phrase}")
    return data


def _path(*parts: str) -> str:
    return "".join("/" + quote(p, safe="") for p in parts)


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


def _pretty(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


def _print_json(data: Any) -> None:
    _echo(_pretty(data))


def _json_arg(option: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _Failed(2, f"{option} is not JSON: {exc}") from None


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


# -- sessions ------------------------------------------------------------------------------------


def _sessions_list(args: argparse.Namespace) -> int:
    data = _request(args, "GET", f"/sessions?{urlencode({'limit': args.limit})}")
    if args.as_json:
        _print_json(data)
        return 0
    rows = [[s["session_id"], s["state"], s["last_step"], s["updated_at"]] for s in data]
    _echo(_table(rows, ["session", "state", "last step", "updated"]))
    return 0


def _sessions_show(args: argparse.Namespace) -> int:
    data = _request(args, "GET", _path("sessions", args.session_id))
    _print_json(data) if args.as_json else _echo(render_session(data))
    return 0


def _sessions_rollback(args: argparse.Namespace) -> int:
    body: dict[str, Any] | None = None
    if args.entry or args.after_step is not None:
        body = {"force": args.force}
        if args.entry:
            body["entries"] = args.entry
        if args.after_step is not None:
            body["after_step"] = args.after_step
    data = _request(args, "POST", _path("sessions", args.session_id, "rollback"), body)
    if args.as_json:
        _print_json(data)
    else:
        _echo(f"{'undo' if body else 'rollback'}: {data['outcome']}")
        if data.get("message"):
            _echo(data["message"])
        for dependent in data.get("dependents", []):
            _echo(
                f"warning: step {dependent['step_index']} {dependent['tool_name']} "
                f"({dependent['state']}) may depend on what was undone"
            )
        _echo(render_session(_request(args, "GET", _path("sessions", args.session_id))))
    return 0 if data["outcome"] in (RollbackOutcome.COMPENSATED, RollbackOutcome.EMPTY) else 1


# -- undo ----------------------------------------------------------------------------------------


def _entry_done(args: argparse.Namespace, data: dict[str, Any]) -> int:
    if args.as_json:
        _print_json(data)
    else:
        _echo(f"entry {data['entry_id']} is {data['state']}; run `sessions rollback` to go on")
    return 0


def _undo_retry(args: argparse.Namespace) -> int:
    return _entry_done(args, _request(args, "POST", _path("undo", args.entry_id, "retry")))


def _undo_resolve(args: argparse.Namespace) -> int:
    path = _path("undo", args.entry_id, "resolve")
    return _entry_done(args, _request(args, "POST", path, {"note": args.note}))


# -- approvals -----------------------------------------------------------------------------------


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def _approval_rows(records: list[dict[str, Any]], decided: bool) -> list[list[Any]]:
    rows = []
    for a in records:
        row = [a["id"], a["tool_name"], a["status"], a["session_id"], a["created_at"],
               a["timeout_at"], _compact(a.get("args"))[:60]]  # fmt: skip
        if decided:  # who decided and why, as stored
            row += [a.get("decided_at"), a.get("decided_by"), a.get("reason")]
        rows.append(row)
    return rows


def _approvals_list(args: argparse.Namespace) -> int:
    query = urlencode({"state": args.state, "limit": args.limit})
    data = _request(args, "GET", f"/approvals?{query}")
    if args.as_json:
        _print_json(data)
        return 0
    headers = ["approval", "tool", "status", "session", "created", "timeout", "args"]
    decided = args.state != ApprovalStatus.PENDING
    if decided:
        headers += ["decided", "by", "reason"]
    _echo(_table(_approval_rows(data, decided), headers))
    return 0


def _decide(action: str) -> Callable[[argparse.Namespace], int]:
    def decide(args: argparse.Namespace) -> int:
        # Who decides is the API key's name, recorded by the proxy: nothing to send for it.
        body: dict[str, Any] = {"reason": args.reason} if args.reason is not None else {}
        if getattr(args, "args", None) is not None:  # approve with changes (docs/approvals.md)
            body["args"] = _json_arg("--args", args.args)
        if getattr(args, "args_hash", None) is not None:  # the arguments you saw
            body["args_hash"] = args.args_hash
        data = _request(args, "POST", _path("approvals", args.approval_id, action), body)
        if args.as_json:
            _print_json(data)
            return 0
        line = f"approval {data['approval_id']}: {data['status']}"
        if data.get("execution") == "awaiting_approvers":
            line += f"; approvals {data.get('approvals')} of {data.get('approvers_required')}"
        elif "execution" in data:
            line += f"; execution {data['execution']}"
            if data.get("error"):
                line += f": {data['error']}"
        _echo(line)
        if data.get("result") is not None:
            _echo(_pretty(data["result"]))
        return 0

    return decide


# -- effects -------------------------------------------------------------------------------------


def _effects_resolve(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"outcome": args.outcome}
    if args.result is not None:
        body["result"] = _json_arg("--result", args.result)
    elif args.outcome == EffectState.COMMITTED:
        raise _Failed(2, "--outcome committed needs --result (what the call returned, as JSON)")
    if args.error is not None:
        body["error"] = args.error
    data = _request(args, "POST", _path("effects", args.effect_id, "resolve"), body)
    if args.as_json:
        _print_json(data)
        return 0
    line = f"effect {data['effect_id']}: {data['state']}"
    if data.get("error"):
        line += f": {data['error']}"
    _echo(line)
    return 0


# -- the parser ----------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors: exit 2 with one clear line
        self.print_usage(sys.stderr)
        raise _Failed(2, message)


def _command(
    group: argparse._SubParsersAction[_Parser],
    name: str,
    run: Callable[[argparse.Namespace], int],
    help_text: str,
) -> _Parser:
    parser = group.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(run=run)
    parser.add_argument("--url", help=f"Proxy base URL (env UNDOLOG_PROXY_URL; {DEFAULT_URL})")
    parser.add_argument("--api-key", help="The org's API key (env UNDOLOG_API_KEY)")
    parser.add_argument("--json", dest="as_json", action="store_true", help="Print the raw JSON")
    return parser


def _group(top: argparse._SubParsersAction[_Parser], name: str) -> Any:
    parser = top.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
    parser.set_defaults(run=lambda _: _usage(parser))
    return parser.add_subparsers(title="commands", metavar="COMMAND")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="undolog",
        description="UndoLog's client commands (they talk to a running proxy; "
        "the server's commands need `pip install 'undolog[server]'`).",
    )
    parser.add_argument("--version", action="store_true", help="Print the version")
    parser.set_defaults(run=lambda _: _usage(parser))
    top = parser.add_subparsers(title="commands", metavar="COMMAND")

    sessions = _group(top, "sessions")
    p = _command(
        sessions, "list", _sessions_list, "Sessions of the org, most recently active first."
    )
    p.add_argument("--limit", type=int, default=50, help="1-500 (default 50)")
    p = _command(sessions, "show", _sessions_show, "A session's effects, undo stack and approvals.")
    p.add_argument("session_id")
    p = _command(
        sessions,
        "rollback",
        _sessions_rollback,
        "Unwind the session's undo stack, newest first (or only chosen entries: docs/undo.md).",
    )
    p.add_argument("session_id")
    p.add_argument(
        "--entry",
        action="append",
        default=[],
        help="Undo only this undo entry (repeatable); the session stays open",
    )
    p.add_argument(
        "--after-step", type=int, help="Undo only the calls after this step; the session stays open"
    )
    p.add_argument(
        "--force", action="store_true", help="Undo even if later calls that stay may depend on it"
    )

    undo = _group(top, "undo")
    p = _command(undo, "retry", _undo_retry, "Put a failed compensation back with fresh retries.")
    p.add_argument("entry_id")
    p = _command(undo, "resolve", _undo_resolve, "Mark a failed compensation as handled by hand.")
    p.add_argument("entry_id")
    p.add_argument("--note", required=True, help="What was done by hand")

    approvals = _group(top, "approvals")
    p = _command(approvals, "list", _approvals_list, "Approval requests of the org, newest first.")
    p.add_argument(
        "--state",
        default=ApprovalStatus.PENDING.value,
        help=f"{', '.join(ApprovalStatus)} or all (default pending)",
    )
    p.add_argument("--limit", type=int, default=100, help="1-500, newest first (default 100)")
    p = _command(
        approvals,
        "approve",
        _decide("approve"),
        "Approve a pending request; a proxy-executed call runs now (with --args: those).",
    )
    p.add_argument("approval_id")
    p.add_argument("--reason", help="Why (stored and shown)")
    p.add_argument("--args", help="The call's arguments as changed by you (a JSON object)")
    p.add_argument(
        "--args-hash",
        dest="args_hash",
        help="The args_hash of the arguments you saw: refused (409) if others would run",
    )
    p = _command(
        approvals, "reject", _decide("reject"), "Reject a pending request and halt its session."
    )
    p.add_argument("approval_id")
    p.add_argument("--reason", help="Why (stored and shown)")

    effects = _group(top, "effects")
    p = _command(
        effects,
        "resolve",
        _effects_resolve,
        "Settle a call left in doubt (its proxy died while it ran): say whether it happened. "
        "Needs an admin key; who resolved it is recorded (docs/faults.md).",
    )
    p.add_argument("effect_id")
    p.add_argument(
        "--outcome",
        required=True,
        choices=["committed", "failed"],
        help="committed: it took effect (give --result); failed: it did not",
    )
    p.add_argument("--result", help="What the call returned, as JSON (needed with committed)")
    p.add_argument("--error", help="What went wrong (with failed; stored with who resolved it)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one client command; the exit code (0 done, 1 refused, 2 usage or unreachable)."""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        if args.version:
            _echo(f"undolog {version()}")
            return 0
        code: int = args.run(args)
        return code
    except _Failed as failed:
        print(f"error: {failed}", file=sys.stderr)
        return failed.code
