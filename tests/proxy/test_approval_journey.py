"""One approval, end to end (issue 15's "Done when"; docs/approvals.md "One approval, end to
end"), through real parts on both stores: a real proxy, the demo upstream, a real local webhook
receiver, and the `undolog audit` CLI as a child process.

A rule that does not match the call leaves the IRREVERSIBLE call waiting for a person (the dry
run says so too); the receiver gets the signed `approval_required`; the approver approves with
edited arguments, the upstream runs those, the agent's retry of the original call gets the
result and the card shows the diff; the receiver gets the decision; the exported audit file
verifies, names the approver key and the approved arguments' digest, and fails on an edit.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson

from tests.proxy.conftest import ProxyHarness
from tests.proxy.test_audit import export, records, verify
from tests.proxy.test_policy_rules import call, new_session, set_rules, upstream_calls
from tests.proxy.test_webhooks import DEADLINE, SECRET, hooked
from tests.support.receiver import Receiver, verify_signature
from tests.support.servers import wait_until
from undolog_sdk import canonical_json

SMALL_TRANSFERS = {
    "name": "small-transfers",
    "tool": "transfer_funds",
    "condition": "amount < 100",
    "action": "approve",
}
# In this org a transfer is IRREVERSIBLE (the demo catalog has it COMPENSABLE).
TRANSFER_TOOL = {"tier": "irreversible"}
REQUESTED = {"amount": 500, "from_account": "ops", "to_account": "acct-42"}
APPROVED = {"amount": 400, "from_account": "ops", "to_account": "acct-42"}


def _signed_event(receiver: Receiver, type_: str) -> dict[str, Any]:
    """The one `type_` delivery, after checking its signature as a receiver would."""
    (request,) = [r for r in receiver.at() if r.headers.get("x-undolog-event") == type_]
    assert verify_signature(SECRET, request.headers["x-undolog-signature"], request.body)
    body: dict[str, Any] = request.json()
    assert request.headers["x-undolog-event-id"] == body["id"]
    return body


def test_one_approval_from_an_unmatched_rule_to_a_verified_audit_file(
    proxy_factory: Any, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.start()
    proxy: ProxyHarness = hooked(proxy_factory, receiver)
    with proxy.client() as admin:
        admin.put("/tools/transfer_funds", json=TRANSFER_TOOL).raise_for_status()
    set_rules(proxy, SMALL_TRANSFERS)
    session = new_session()
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        # 1. The rule does not match 500: the IRREVERSIBLE call waits; the dry run agrees.
        dry = person.post(
            "/policy/dry-run", json={"tool_name": "transfer_funds", "args": REQUESTED}
        )
        assert dry.status_code == 200, dry.text
        assert (dry.json()["rule"], dry.json()["decision"]) == (None, "approval")
        assert dry.json()["tier"] == "irreversible"
        asked = call(agent, "transfer_funds", session, 1, **REQUESTED)
        assert asked.status_code == 202, asked.text
        assert asked.json()["status"] == "pending_approval"
        approval_id, effect_id = asked.json()["approval_id"], asked.json()["effect_id"]
        assert upstream_calls(proxy, "transfer_funds") == []

        # 2. The receiver gets `approval_required`, signed.
        wait_until(lambda: bool(receiver.events("approval_required")), timeout=DEADLINE,
                   what="the approval_required webhook")  # fmt: skip
        required = _signed_event(receiver, "approval_required")
        assert required["approval"]["approval_id"] == approval_id
        assert (required["effect_id"], required["session_id"]) == (effect_id, session)
        assert required["approval"]["args"] == REQUESTED
        assert required["approval"]["status"] == "pending"

        # 3. Approved with 400: the upstream runs 400, the retry of 500 gets the result.
        decided = person.post(
            f"/approvals/{approval_id}/approve", json={"args": APPROVED, "reason": "cap at 400"}
        )
        assert decided.status_code == 200, decided.text
        assert decided.json()["execution"] == "committed"
        result = decided.json()["result"]
        assert (result["success"], result["output"]["amount"]) == (True, 400)
        (ran,) = upstream_calls(proxy, "transfer_funds")
        assert ran["args"] == APPROVED
        retry = call(agent, "transfer_funds", session, 1, **REQUESTED)
        assert retry.status_code == 200, retry.text
        assert retry.json()["status"] == "replayed"
        assert (retry.json()["effect_id"], retry.json()["result"]) == (effect_id, result)
        card = person.get(f"/approvals/{approval_id}").json()
        assert (card["status"], card["decided_by"]) == ("approved", "key:approver")
        assert (card["arguments"], card["approved_args"]) == (REQUESTED, APPROVED)
        assert card["args_diff"] == {
            "added": {},
            "removed": {},
            "changed": {"amount": {"from": 500, "to": 400}},
        }
    assert len(upstream_calls(proxy, "transfer_funds")) == 1

    # 4. The receiver gets the decision, signed, with who decided and the approved arguments.
    wait_until(lambda: bool(receiver.events("approval_approved")), timeout=DEADLINE,
               what="the approval_approved webhook")  # fmt: skip
    approved = _signed_event(receiver, "approval_approved")
    assert approved["approval"]["approval_id"] == approval_id
    assert approved["approval"]["status"] == "approved"
    assert approved["approval"]["decided_by"] == "key:approver"
    assert approved["approval"]["reason"] == "cap at 400"
    assert approved["approval"]["approved_args"] == APPROVED

    # 5. The audit file: the call, the decision by the approver key, the approved args' digest.
    path = tmp_path / "audit.jsonl"
    head = export(proxy, path)["head"]
    checked = verify(path, "--head", head)
    assert checked.returncode == 0, checked.stderr
    written = records(path)
    mine = [r for r in written if r["effect_id"] == effect_id]
    types = [r["type"] for r in mine]
    assert types == ["approval_required", "approval_approved", "effect_intercepted",
                     "effect_committed", "effect_replayed"]  # fmt: skip
    requested_digest = hashlib.sha256(canonical_json(REQUESTED).encode()).hexdigest()
    approved_digest = hashlib.sha256(canonical_json(APPROVED).encode()).hexdigest()
    assert {r["call"]["args_sha256"] for r in mine} == {requested_digest}
    assert {r["call"]["tool_name"] for r in mine} == {"transfer_funds"}
    (decision,) = [r for r in mine if r["type"] == "approval_approved"]
    assert decision["data"]["decided_by"] == "key:approver"
    assert decision["data"]["approval_id"] == approval_id
    assert decision["data"]["approved_args_sha256"] == approved_digest

    # One edited line (the decider renamed) and verify names it.
    lines = path.read_text().splitlines()
    where = written.index(decision)
    forged = dict(decision, data=dict(decision["data"], decided_by="key:someone-else"))
    lines[where] = orjson.dumps(forged).decode()
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join(lines) + "\n")
    caught = verify(tampered, "--head", head)
    assert caught.returncode == 1
    assert caught.stderr.split(": ")[1] == f"line {where + 1}"
