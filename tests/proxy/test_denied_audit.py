"""A call a policy rule denies leaves a trace, on both stores (docs/audit.md, docs/approvals.md).

Before: a `deny` rule answered 403 `policy_denied` and wrote nothing, so the audit file had
no record that the call was asked for, by which key, or which rule refused it. Now the denial
is an event, `call_denied` (`decided_by = rule:NAME`, the rule, the requesting key's name, the
tool, the step and the SHA-256 of the args), in the transaction of the decision; no effect,
undo entry or approval is written (nothing ran), the export carries it, `verify` passes.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_audit import export, records, verify
from tests.proxy.test_policy_rules import call, set_rules, upstream_calls
from undolog_sdk.signature import canonical_json

BIG = {"name": "big-transfers", "tool": "transfer_funds", "condition": "amount >= 1000",
       "action": "deny"}  # fmt: skip


def test_a_denied_call_is_in_the_audit_with_its_rule_and_key(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    set_rules(proxy, BIG)
    session = str(uuid.uuid4())
    with proxy.client(proxy.agent_key) as agent:
        refused = call(agent, "transfer_funds", session, 1, amount=5000, to_account="x")
        assert (refused.status_code, refused.json()["code"]) == (403, "policy_denied")
        view = agent.get(f"/sessions/{session}")
        done = call(agent, "transfer_funds", session, 2, amount=10, to_account="x")
        assert done.status_code == 200, done.text
    with proxy.client(proxy.approver_key) as approver:
        recent = approver.get("/events/recent", params={"limit": 50}).json()

    path = tmp_path / "audit.jsonl"
    summary = export(proxy, path)
    checked = verify(path, "--head", summary["head"])
    assert checked.returncode == 0, checked.stderr
    written = records(path)
    [denied] = [r for r in written if r["type"] == "call_denied"]
    args_sha = hashlib.sha256(
        canonical_json({"amount": 5000, "to_account": "x"}).encode()
    ).hexdigest()
    assert denied["session_id"] == session
    assert denied["effect_id"] is None and "call" not in denied
    assert denied["data"] == {
        "decision": "denied",
        "decided_by": "rule:big-transfers",
        "rule": "big-transfers",
        "requested_by": "key:agent",
        "tool_name": "transfer_funds",
        "tier": "compensable",
        "step_index": 1,
        "args_sha256": args_sha,
    }
    # Nothing ran and nothing of the denied call was recorded as an effect.
    assert view.status_code == 404 or view.json()["effects"] == [], view.text
    assert [c["args"]["amount"] for c in upstream_calls(proxy, "transfer_funds")] == [10]
    effects = [r for r in written if r["effect_id"] is not None and r["session_id"] == session]
    assert {r["call"]["step_index"] for r in effects} == {2}
    items = recent if isinstance(recent, list) else recent["items"]
    assert any(e["type"] == "call_denied" for e in items), recent


def test_a_denied_step_less_call_takes_no_step(proxy: ProxyHarness, tmp_path: Path) -> None:
    set_rules(proxy, BIG)
    session = str(uuid.uuid4())
    body = {"session_id": session, "tool_name": "transfer_funds",
            "args": {"amount": 5000, "to_account": "x"}}  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        refused = agent.post("/mcp/tool_call", json=body)
        assert refused.status_code == 403, refused.text
        ran = agent.post("/mcp/tool_call", json={**body, "args": {"amount": 1, "to_account": "x"}})
        assert ran.status_code == 200, ran.text
    path = tmp_path / "audit.jsonl"
    export(proxy, path)
    written = records(path)
    [denied] = [r for r in written if r["type"] == "call_denied"]
    assert denied["data"]["step_index"] is None
    assert ran.headers["X-UndoLog-Step-Index"] == "1"  # the denied call took no step
