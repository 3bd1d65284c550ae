"""`/policy`: an org's policy rules (read; replace, admin keys only) and the dry run.

The rules are an ordered list, replaced whole by `PUT /policy/rules` (the first matching rule
wins, so a list is never half saved); a list with any wrong part is refused with 400 and
nothing is saved. `POST /policy/dry-run` answers which rule a call would hit and the decision,
recording nothing. The language and the semantics: docs/approvals.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from undolog.engine.rules import Rule, rules_json
from undolog.proxy.inputs import storable
from undolog.proxy.wire import json_response, loads_exact
from undolog_sdk.errors import InvalidRequest

if TYPE_CHECKING:
    from undolog.runtime import Runtime

__all__ = ["router"]

router = APIRouter()


async def _object(request: Request, fields: set[str]) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = loads_exact(raw) if raw.strip() else None
    except ValueError as exc:
        raise InvalidRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    unknown = set(data) - fields
    if unknown:
        raise InvalidRequest(f"unknown fields: {sorted(unknown)}")
    return data


def _rules_answer(rules: tuple[Rule, ...]) -> Response:
    return json_response({"rules": rules_json(rules)})


@router.get("/policy/rules")
async def get_rules(request: Request) -> Response:
    """The org's policy rules, in the order they are tried."""
    runtime: Runtime = request.app.state.runtime
    return _rules_answer(await runtime.engine.get_rules(request.state.org_id))


@router.put("/policy/rules")
async def put_rules(request: Request) -> Response:
    """Replace the org's policy rules whole (admin keys only)."""
    runtime: Runtime = request.app.state.runtime
    data = await _object(request, {"rules"})
    if "rules" not in data:
        raise InvalidRequest("missing rules")
    rules = await runtime.engine.put_rules(
        request.state.org_id, data["rules"], updated_by=request.state.principal.decider
    )
    return _rules_answer(rules)


@router.post("/policy/dry-run")
async def dry_run(request: Request) -> Response:
    """Which rule a call of `tool_name` with `args` would hit, and the decision."""
    runtime: Runtime = request.app.state.runtime
    data = await _object(request, {"tool_name", "args"})
    tool_name = data.get("tool_name")
    if not isinstance(tool_name, str) or not tool_name:
        raise InvalidRequest("tool_name must be a non-empty string")
    storable(tool_name, "tool_name")
    found = await runtime.engine.dry_run(request.state.org_id, tool_name, data.get("args"))
    return json_response(
        {
            "tool_name": found.tool.name,
            "tier": found.tool.tier,
            "rule": found.rule.to_dict() if found.rule else None,
            "decision": found.decision,
            "approvers": found.approvers,
            "error": found.error,
        }
    )
