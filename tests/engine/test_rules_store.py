"""Policy rules and changed args in the engine over both stores: what intercept records and
hands back when a rule matched or an approver changed the call (docs/approvals.md)."""

from __future__ import annotations

import uuid

import orjson
import pytest

from undolog.engine import Engine, Outcome
from undolog.engine.approvals import Approvals, Verdict
from undolog.store import Store
from undolog_sdk.errors import PolicyDenied


@pytest.fixture
async def engine(store: Store, org_id: str) -> Engine:
    engine = Engine(store, lease_seconds=30)
    await engine.ensure_org(org_id)
    await engine.register_tool(org_id, "delete_database", tier="irreversible")
    return engine


async def test_a_changed_call_runs_with_the_approved_args_again_after_a_failure(
    engine: Engine, org_id: str
) -> None:
    session = str(uuid.uuid4())
    asked = await engine.intercept(org_id, session, "delete_database", {"db": "prod"}, step_index=1)
    assert asked.outcome is Outcome.AWAITING_APPROVAL and asked.approval_id is not None
    approved = await Approvals(engine).decide(
        org_id, asked.approval_id, Verdict.APPROVE, decided_by="key:a", approver_key_id="k_a",
        args={"db": "copy"},
    )  # fmt: skip
    assert approved.run is not None and approved.run.args_json == '{"db":"copy"}'
    # Nothing reached the tool: failed; the agent's retry of the original call runs it again,
    # with the approved args, on the same effect.
    await engine.fail(org_id, approved.effect.effect_id, "connection refused")
    again = await engine.intercept(org_id, session, "delete_database", {"db": "prod"}, step_index=1)
    assert again.outcome is Outcome.EXECUTE and again.effect_id == approved.effect.effect_id
    assert again.args_json is not None and orjson.loads(again.args_json) == {"db": "copy"}
    effect = await engine.get_effect(org_id, again.effect_id)
    assert orjson.loads(effect.args_json) == {"db": "prod"}  # the request, as made


async def test_a_denied_call_leaves_no_effect_and_a_rule_approval_is_recorded(
    engine: Engine, org_id: str
) -> None:
    await engine.put_rules(
        org_id,
        [{"name": "no-prod", "tool": "delete_database", "condition": 'db == "prod"',
          "action": "deny"},
         {"name": "rest", "tool": "delete_database", "action": "approve"}],
    )  # fmt: skip
    session = str(uuid.uuid4())
    with pytest.raises(PolicyDenied) as denied:
        await engine.intercept(org_id, session, "delete_database", {"db": "prod"}, step_index=1)
    assert denied.value.rule == "no-prod"
    view = await engine.session_view(org_id, session)
    assert view.effects == [] and view.approvals == []
    ran = await engine.intercept(org_id, session, "delete_database", {"db": "dev"}, step_index=2)
    assert ran.outcome is Outcome.EXECUTE
    (approval,) = (await engine.session_view(org_id, session)).approvals
    assert (approval.status, approval.decided_by, approval.rule) == (
        "auto_approved", "rule:rest", "rest"
    )  # fmt: skip


@pytest.mark.security
async def test_a_deny_rule_that_cannot_be_decided_denies_through_intercept(
    engine: Engine, org_id: str
) -> None:
    await engine.put_rules(
        org_id,
        [{"name": "prod-only", "tool": "*", "condition": '"prod" in tags', "action": "deny"}],
        updated_by="key:admin",
    )
    session = str(uuid.uuid4())
    for tags in (["x"] * 5000, ["PROD"], [["prod"]]):  # over the cap, case, another kind
        with pytest.raises(PolicyDenied):
            await engine.intercept(org_id, session, "delete_database", {"tags": tags}, step_index=1)
    asked = await engine.intercept(
        org_id, session, "delete_database", {"tags": ["x"]}, step_index=1
    )
    assert asked.outcome is Outcome.AWAITING_APPROVAL


@pytest.mark.security
async def test_a_match_past_the_inline_budget_runs_in_a_thread_with_the_same_answer(
    engine: Engine, org_id: str
) -> None:
    # 40 terms over 1,000 items: past INLINE_STEPS, within MAX_STEPS; the last term matches.
    condition = " or ".join(f'"t{n}" in tags' for n in range(40)) + ' or "hit" in tags'
    await engine.put_rules(
        org_id,
        [{"name": "deep", "tool": "delete_database", "condition": condition, "action": "approve"}],
        updated_by="key:admin",
    )
    tags = [f"tag-{n}" for n in range(999)] + ["hit"]
    found = await engine.match_rules(org_id, "delete_database", {"tags": tags})
    assert found.rule is not None and found.rule.name == "deep" and found.error is None
    assert await engine.match_rule(org_id, "delete_database", {"tags": tags[:-1]}) is None
