"""Policy rules and approve-with-changes through a real proxy and a real demo upstream, on both
stores (docs/approvals.md).

Rules: an `approve` rule runs an IRREVERSIBLE call without a person and records the rule as
its decider; a `deny` rule refuses a call before anything is recorded; a `require` rule asks
for N distinct approvers (not the requesting key, the same key counting once); no match keeps
today's behaviour; a recorded call keeps its decision after the rules change; the dry run
records nothing; only admin keys replace the rules, and a bad list is refused whole.
Approve with changes: the upstream sees the approved args, the approval keeps both and the
diff, the agent's retry of the original call gets the result, a rollback compensates with the
approved args.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.proxy.conftest import ProxyHarness

TOOL_CALL = "/mcp/tool_call"


def new_session() -> str:
    return str(uuid.uuid4())


def call(c: httpx.Client, tool: str, session: str, step: int = 1, **args: Any) -> httpx.Response:
    body = {"session_id": session, "tool_name": tool, "step_index": step, "args": args}
    return c.post(TOOL_CALL, json=body)


def put_rules(c: httpx.Client, *rules: dict[str, Any]) -> httpx.Response:
    return c.put("/policy/rules", json={"rules": list(rules)})


def set_rules(proxy: ProxyHarness, *rules: dict[str, Any]) -> None:
    with proxy.client() as admin:
        response = put_rules(admin, *rules)
        assert response.status_code == 200, response.text


def code(response: httpx.Response) -> str:
    found: str = response.json()["code"]
    return found


def upstream_calls(proxy: ProxyHarness, tool: str) -> list[dict[str, Any]]:
    with proxy.upstream() as c:
        calls: list[dict[str, Any]] = c.get("/calls", params={"org": proxy.org_id}).json()
    return [x for x in calls if x["tool"] == tool]


# The documented rule (docs/approvals.md): mail with any recipient outside the company.
OUTSIDE_MAIL = {
    "name": "outside-mail",
    "tool": "send_email",
    "condition": 'not all(addresses(to, cc, bcc), domain(it) == "ourcompany.com")',
    "action": "require",
    "approvers": 2,
}

STAGING_DROPS = {
    "name": "staging-drops",
    "tool": "delete_database",
    "condition": 'db_name startswith "staging-"',
    "action": "approve",
}


# --- approve / deny / no match -------------------------------------------------------------


def test_an_approve_rule_runs_an_irreversible_call_without_a_person(proxy: ProxyHarness) -> None:
    set_rules(proxy, STAGING_DROPS)
    session = new_session()
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        done = call(agent, "delete_database", session, 1, db_name="staging-7")
        assert done.status_code == 200, done.text
        assert done.json()["result"]["output"] == {"db_name": "staging-7", "status": "deleted"}
        # The decision and the rule that made it are on record, as an approval.
        (decided,) = person.get("/approvals", params={"state": "auto_approved"}).json()
        assert decided["effect_id"] == done.json()["effect_id"]
        assert decided["decided_by"] == "rule:staging-drops"
        assert decided["rule"] == "staging-drops"
        # No match: an IRREVERSIBLE call still waits for a person.
        waiting = call(agent, "delete_database", session, 2, db_name="prod")
        assert waiting.status_code == 202, waiting.text
        pending = person.get(f"/approvals/{waiting.json()['approval_id']}").json()
        assert pending["rule"] is None and pending["status"] == "pending"
    assert len(upstream_calls(proxy, "delete_database")) == 1


def test_a_deny_rule_refuses_the_call_before_anything_is_recorded(proxy: ProxyHarness) -> None:
    set_rules(
        proxy,
        {"name": "big-transfers", "tool": "transfer_funds", "condition": "amount >= 1000",
         "action": "deny"},
    )  # fmt: skip
    session = new_session()
    with proxy.client(proxy.agent_key) as agent:
        refused = call(agent, "transfer_funds", session, 1, amount=5000, to_account="x")
        assert refused.status_code == 403, refused.text
        assert code(refused) == "policy_denied"
        assert refused.json()["rule"] == "big-transfers"
        assert refused.json()["tool_name"] == "transfer_funds"
        view = agent.get(f"/sessions/{session}")
        assert view.status_code == 404 or view.json()["effects"] == []
        # The same tool under the limit runs.
        done = call(agent, "transfer_funds", session, 2, amount=10, to_account="x")
        assert done.status_code == 200, done.text
    assert [c["args"]["amount"] for c in upstream_calls(proxy, "transfer_funds")] == [10]


def test_the_first_matching_rule_wins_and_star_matches_every_tool(proxy: ProxyHarness) -> None:
    set_rules(
        proxy,
        {"name": "allow-test-db", "tool": "delete_database", "condition": 'db_name == "test"',
         "action": "approve"},
        {"name": "no-drops", "tool": "*", "condition": 'db_name != null', "action": "deny"},
    )  # fmt: skip
    with proxy.client(proxy.agent_key) as agent:
        assert call(agent, "delete_database", new_session(), db_name="test").status_code == 200
        refused = call(agent, "delete_database", new_session(), db_name="other")
        assert (refused.status_code, refused.json()["rule"]) == (403, "no-drops")


# --- require, N approvers ------------------------------------------------------------------


def test_a_require_rule_needs_two_distinct_approvers_and_never_the_requester(
    proxy: ProxyHarness,
) -> None:
    set_rules(proxy, OUTSIDE_MAIL)
    session = new_session()
    with (
        proxy.client(proxy.agent_key) as agent,
        proxy.client(proxy.approver_key) as approver,
        proxy.client() as admin,
    ):
        # Inside the company: the rule does not match, a COMPENSABLE call runs at once.
        inside = call(agent, "send_email", session, 1, to="a@ourcompany.com", subject="s")
        assert inside.status_code == 200, inside.text
        asked = call(agent, "send_email", session, 2, to="x@elsewhere.org", subject="s")
        assert asked.status_code == 202, asked.text
        approval_id = asked.json()["approval_id"]
        first = approver.post(f"/approvals/{approval_id}/approve")
        assert first.status_code == 200, first.text
        assert first.json()["execution"] == "awaiting_approvers"
        assert (first.json()["approvals"], first.json()["approvers_required"]) == (1, 2)
        again = approver.post(f"/approvals/{approval_id}/approve")  # the same key: once
        assert (again.json()["execution"], again.json()["approvals"]) == ("awaiting_approvers", 1)
        assert (
            call(agent, "send_email", session, 2, to="x@elsewhere.org", subject="s").status_code
            == 202
        )
        done = admin.post(f"/approvals/{approval_id}/approve")
        assert done.status_code == 200, done.text
        assert done.json()["execution"] == "committed"
        card = approver.get(f"/approvals/{approval_id}").json()
        assert card["status"] == "approved" and card["rule"] == "outside-mail"
        assert card["approved_by"] == ["key:approver", "key:admin"]
        replay = call(agent, "send_email", session, 2, to="x@elsewhere.org", subject="s")
        assert replay.status_code == 200 and replay.json()["status"] == "replayed"
    assert len(upstream_calls(proxy, "send_email")) == 2


@pytest.mark.security
def test_the_key_that_made_a_rule_required_call_cannot_approve_it(proxy: ProxyHarness) -> None:
    set_rules(proxy, {"name": "every-echo", "tool": "echo", "action": "require"})
    with proxy.client() as admin, proxy.client(proxy.agent_key) as agent:
        asked = call(admin, "echo", new_session(), value=1)  # an admin key may call tools
        assert asked.status_code == 202, asked.text
        own = admin.post(f"/approvals/{asked.json()['approval_id']}/approve")
        assert (own.status_code, code(own)) == (403, "forbidden")
        by_agent = agent.post(f"/approvals/{asked.json()['approval_id']}/approve")
        assert by_agent.status_code == 403
    assert upstream_calls(proxy, "echo") == []


# --- the dry run -----------------------------------------------------------------------------


def test_the_dry_run_names_the_rule_and_the_decision_and_records_nothing(
    proxy: ProxyHarness,
) -> None:
    set_rules(
        proxy, STAGING_DROPS,
        {"name": "two-for-mail", "tool": "send_email", "action": "require", "approvers": 2},
    )  # fmt: skip
    with proxy.client(proxy.approver_key) as person:
        hit = person.post(
            "/policy/dry-run",
            json={"tool_name": "delete_database", "args": {"db_name": "staging-1"}},
        )
        assert hit.status_code == 200, hit.text
        assert hit.json()["rule"]["name"] == "staging-drops"
        assert (hit.json()["decision"], hit.json()["tier"]) == ("execute", "irreversible")
        miss = person.post(
            "/policy/dry-run", json={"tool_name": "delete_database", "args": {"db_name": "p"}}
        ).json()
        assert (miss["rule"], miss["decision"], miss["approvers"]) == (None, "approval", 1)
        mail = person.post(
            "/policy/dry-run", json={"tool_name": "send_email", "args": {"to": "a"}}
        ).json()
        assert (mail["decision"], mail["approvers"]) == ("approval", 2)
        unknown = person.post("/policy/dry-run", json={"tool_name": "nope", "args": {}})
        assert (unknown.status_code, code(unknown)) == (404, "tool_not_registered")
        assert person.get("/sessions").json() == []
        assert person.get("/approvals", params={"state": "auto_approved"}).json() == []
    assert upstream_calls(proxy, "delete_database") == []


# --- editing the rules ---------------------------------------------------------------------


@pytest.mark.security
def test_only_admin_keys_replace_the_rules(proxy: ProxyHarness) -> None:
    set_rules(proxy, STAGING_DROPS)
    everything = {"name": "all", "tool": "*", "action": "approve"}
    for key in (proxy.agent_key, proxy.approver_key):
        with proxy.client(key) as c:
            refused = put_rules(c, everything)
            assert (refused.status_code, code(refused)) == (403, "forbidden")
    with proxy.client(proxy.agent_key) as agent:
        assert agent.get("/policy/rules").status_code == 403
        assert (
            agent.post("/policy/dry-run", json={"tool_name": "echo", "args": {}}).status_code == 403
        )
    with proxy.client(proxy.approver_key) as approver:
        assert approver.get("/policy/rules").json()["rules"] == [STAGING_DROPS]


@pytest.mark.security
@pytest.mark.parametrize(
    ("rule", "where"),
    [
        ({"name": "x", "action": "approve", "condition": "amount <"}, "rules[0].condition"),
        (
            {"name": "x", "action": "approve", "condition": "amount < 1" + " or a == 1" * 300},
            "longer than",
        ),
        ({"name": "x", "action": "approve", "condition": "(" * 50 + "a" + ")" * 50}, "nests"),
        ({"name": "x", "action": "approve", "condition": "__import__('os')"}, "condition"),
        ({"name": "x", "action": "allow"}, "rules[0].action"),
        ({"name": "bad name!", "action": "deny"}, "rules[0].name"),
        ({"name": "x", "action": "deny", "approvers": 2}, "approvers"),
        ({"name": "x", "action": "require", "approvers": 1000}, "approvers"),
        ({"name": "x", "action": "deny", "extra": 1}, "unknown fields"),
    ],
)
def test_a_bad_rule_is_refused_clearly_and_nothing_is_saved(
    proxy: ProxyHarness, rule: dict[str, Any], where: str
) -> None:
    set_rules(proxy, STAGING_DROPS)
    with proxy.client() as admin:
        refused = put_rules(admin, {"name": "fine", "action": "deny", "tool": "echo"}, rule)
        assert (refused.status_code, code(refused)) == (400, "invalid_request"), refused.text
        assert where.replace("[0]", "[1]") in refused.json()["message"]
        assert admin.get("/policy/rules").json()["rules"] == [STAGING_DROPS]


@pytest.mark.security
def test_too_many_rules_and_huge_args_are_refused(proxy: ProxyHarness) -> None:
    set_rules(
        proxy, {"name": "deep", "tool": "echo", "condition": "a.b.c.d == 1", "action": "deny"}
    )
    with proxy.client() as admin:
        many = [{"name": f"r{n}", "action": "deny"} for n in range(101)]
        assert admin.put("/policy/rules", json={"rules": many}).status_code == 400
        nested = '{"a": ' * 5000 + "1" + "}" * 5000
        text = f'{{"session_id": "{new_session()}", "tool_name": "echo", "args": {nested}}}'
        refused = admin.post(TOOL_CALL, content=text, headers={"Content-Type": "application/json"})
        assert refused.status_code in (400, 413), refused.text
        # Deep enough to match: the rule's path is followed, nothing more.
        hit = call(admin, "echo", new_session(), a={"b": {"c": {"d": 1}}})
        assert (hit.status_code, code(hit)) == (403, "policy_denied")


def test_rules_from_the_config_are_in_force_at_start(proxy_factory: Any) -> None:
    proxy: ProxyHarness = proxy_factory({"rules": (STAGING_DROPS,)})
    with proxy.client(proxy.approver_key) as person:
        assert person.get("/policy/rules").json()["rules"] == [STAGING_DROPS]
    with proxy.client(proxy.agent_key) as agent:
        assert call(agent, "delete_database", new_session(), db_name="staging-1").status_code == 200


# --- a recorded call keeps its decision ------------------------------------------------------


def test_a_recorded_call_keeps_its_decision_when_the_rules_change(proxy: ProxyHarness) -> None:
    set_rules(proxy, STAGING_DROPS)
    session = new_session()
    with proxy.client(proxy.agent_key) as agent:
        ran = call(agent, "delete_database", session, 1, db_name="staging-2")
        assert ran.status_code == 200, ran.text
        waiting = call(agent, "delete_database", session, 2, db_name="prod")
        assert waiting.status_code == 202
        set_rules(proxy, {"name": "deny-all", "tool": "*", "action": "deny"})
        replay = call(agent, "delete_database", session, 1, db_name="staging-2")
        assert replay.status_code == 200 and replay.json()["status"] == "replayed"
        still = call(agent, "delete_database", session, 2, db_name="prod")
        assert still.status_code == 202
        assert still.json()["approval_id"] == waiting.json()["approval_id"]
        set_rules(proxy, {"name": "approve-all", "tool": "*", "action": "approve"})
        assert call(agent, "delete_database", session, 2, db_name="prod").status_code == 202
        fresh = call(agent, "delete_database", session, 3, db_name="new")
        assert fresh.status_code == 200
    assert len(upstream_calls(proxy, "delete_database")) == 2


# --- approve with changes --------------------------------------------------------------------


def test_an_approver_changes_the_args_the_upstream_sees_them_and_the_retry_gets_the_result(
    proxy: ProxyHarness,
) -> None:
    session = new_session()
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        asked = call(agent, "delete_database", session, 1, db_name="prod", note="cleanup")
        assert asked.status_code == 202, asked.text
        approval_id = asked.json()["approval_id"]
        done = person.post(
            f"/approvals/{approval_id}/approve",
            json={"args": {"db_name": "prod-copy", "dry": False}, "reason": "not prod"},
        )
        assert done.status_code == 200, done.text
        assert done.json()["execution"] == "committed"
        assert done.json()["result"]["output"] == {"db_name": "prod-copy", "status": "deleted"}
        card = person.get(f"/approvals/{approval_id}").json()
        assert card["arguments"] == {"db_name": "prod", "note": "cleanup"}
        assert card["approved_args"] == {"db_name": "prod-copy", "dry": False}
        assert card["args_diff"] == {
            "added": {"dry": False},
            "removed": {"note": "cleanup"},
            "changed": {"db_name": {"from": "prod", "to": "prod-copy"}},
        }
        assert card["decided_by"] == "key:approver"
        retry = call(agent, "delete_database", session, 1, db_name="prod", note="cleanup")
        assert retry.status_code == 200, retry.text
        assert retry.json()["status"] == "replayed"
        assert retry.json()["result"]["output"] == {"db_name": "prod-copy", "status": "deleted"}
    (ran,) = upstream_calls(proxy, "delete_database")
    assert ran["args"] == {"db_name": "prod-copy", "dry": False}


def test_a_rollback_compensates_with_the_approved_args(proxy: ProxyHarness) -> None:
    set_rules(proxy, {"name": "echo-needs-one", "tool": "echo", "action": "require"})
    session = new_session()
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        asked = call(agent, "echo", session, 1, value="requested")
        assert asked.status_code == 202, asked.text
        done = person.post(
            f"/approvals/{asked.json()['approval_id']}/approve", json={"args": {"value": "ok"}}
        )
        assert done.json()["execution"] == "committed", done.text
        rolled = agent.post(f"/sessions/{session}/rollback")
        assert rolled.status_code == 200, rolled.text
    forward, undo = upstream_calls(proxy, "echo")
    assert forward["args"] == {"value": "ok"}
    assert undo["args"]["original_args"] == {"value": "ok"}


def test_changed_args_are_checked(proxy: ProxyHarness) -> None:
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        asked = call(agent, "delete_database", new_session(), db_name="prod")
        approval_id = asked.json()["approval_id"]
        for body in ({"args": [1]}, {"args": "x"}, {"args": {"n": 2**70}}):
            refused = person.post(f"/approvals/{approval_id}/approve", json=body)
            assert (refused.status_code, code(refused)) == (400, "invalid_request"), body
        on_reject = person.post(f"/approvals/{approval_id}/reject", json={"args": {"a": 1}})
        assert on_reject.status_code == 400
        sdk = agent.post(
            TOOL_CALL,
            json={"session_id": new_session(), "tool_name": "delete_database", "step_index": 1,
                  "args": {"db_name": "x"}, "mode": "sdk"},
        )  # fmt: skip
        refused = person.post(
            f"/approvals/{sdk.json()['approval_id']}/approve", json={"args": {"db_name": "y"}}
        )
        assert refused.status_code == 400 and "proxy-executed" in refused.json()["message"]
        assert person.get(f"/approvals/{approval_id}").json()["status"] == "pending"


@pytest.mark.security
def test_the_dry_run_refuses_what_no_store_can_hold_and_bad_bodies(proxy: ProxyHarness) -> None:
    with proxy.client(proxy.approver_key) as person:
        for body in (
            {"tool_name": "echo\u0000", "args": {}},
            {"tool_name": "", "args": {}},
            {"tool_name": "echo", "args": [1]},
            {"tool_name": "echo", "args": {}, "org_id": "another"},
        ):
            refused = person.post("/policy/dry-run", json=body)
            assert (refused.status_code, code(refused)) == (400, "invalid_request"), body


# --- rules that fail closed, at a bounded cost (issue 22) ------------------------------------


def wide(ascii_text: str) -> str:
    """The full-width (compatibility) form of ASCII text: NFKC maps it back."""
    return "".join(chr(ord(ch) + 0xFEE0) for ch in ascii_text)


@pytest.mark.security
def test_the_outside_mail_rule_is_not_bypassed_by_a_recipient_list(proxy: ProxyHarness) -> None:
    set_rules(proxy, OUTSIDE_MAIL)
    bypasses: list[dict[str, Any]] = [
        {"to": "attacker@evil.com, bob@ourcompany.com"},  # the reported bypass
        {"to": "bob@ourcompany.com; attacker@EVIL.COM"},
        {"to": '"bob@ourcompany.com" <attacker@evil.com>'},
        {"to": "bob@\u043eurcompany.com"},  # a Cyrillic look-alike is another domain
        {"to": "attacker@" + wide("evil") + ".com"},
        {"to": "bob@ourcompany.com", "bcc": "attacker@evil.com"},
        {"to": "attacker@evil.com(bob@ourcompany.com)"},  # unreadable: fails closed
    ]
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        for step, args in enumerate(bypasses, start=1):
            body = {"tool_name": "send_email", "args": {**args, "subject": "s"}}
            dry = person.post("/policy/dry-run", json=body).json()
            assert (dry["decision"], dry["approvers"]) == ("approval", 2), args
            assert dry["rule"]["name"] == "outside-mail", args
            asked = call(agent, "send_email", new_session(), step, **args, subject="s")
            assert asked.status_code == 202, (args, asked.text)
        # Inside the company, in any case and with a display name, it runs at once.
        inside = {"to": "Bob <bob@OurCompany.COM>, al@ourcompany.com", "subject": "s"}
        dry = person.post("/policy/dry-run", json={"tool_name": "send_email", "args": inside})
        assert (dry.json()["decision"], dry.json()["rule"]) == ("execute", None)
        assert call(agent, "send_email", new_session(), 1, **inside).status_code == 200
    assert [c["args"]["to"] for c in upstream_calls(proxy, "send_email")] == [inside["to"]]


@pytest.mark.security
def test_deny_rules_are_not_slipped_past_by_kinds_case_or_width(proxy: ProxyHarness) -> None:
    set_rules(
        proxy,
        {"name": "big-transfers", "tool": "transfer_funds", "condition": "amount >= 10000",
         "action": "deny"},
        {"name": "prod-records", "tool": "create_record", "condition": 'tags == ["prod"]',
         "action": "deny"},
        {"name": "evil-mail", "tool": "send_email",
         "condition": 'any(addresses(to, cc, bcc), domain(it) == "evil.com")', "action": "deny"},
        {"name": "prod-env", "tool": "create_record", "condition": 'env == "prod"',
         "action": "deny"},
    )  # fmt: skip
    denied: list[tuple[str, dict[str, Any], str]] = [
        ("transfer_funds", {"amount": "50000", "to_account": "x"}, "big-transfers"),
        ("transfer_funds", {"amount": "50,000", "to_account": "x"}, "big-transfers"),
        ("transfer_funds", {"amount": [50000], "to_account": "x"}, "big-transfers"),
        ("create_record", {"tags": ["prod"]}, "prod-records"),
        ("create_record", {"tags": ["PROD"]}, "prod-records"),
        ("send_email", {"to": "attacker@EVIL.com", "subject": "s"}, "evil-mail"),
        ("send_email", {"to": "attacker@" + wide("evil") + ".com", "subject": "s"}, "evil-mail"),
        ("send_email", {"to": "a@ourcompany.com,attacker@evil.com", "subject": "s"}, "evil-mail"),
        ("create_record", {"env": wide("prod")}, "prod-env"),
        ("create_record", {"env": "Prod"}, "prod-env"),
    ]
    with proxy.client(proxy.agent_key) as agent, proxy.client(proxy.approver_key) as person:
        for step, (tool, args, rule) in enumerate(denied, start=1):
            dry = person.post("/policy/dry-run", json={"tool_name": tool, "args": args}).json()
            assert (dry["decision"], dry["rule"]["name"]) == ("deny", rule), (tool, args)
            refused = call(agent, tool, new_session(), step, **args)
            assert (refused.status_code, code(refused)) == (403, "policy_denied"), (tool, args)
            assert refused.json()["rule"] == rule
        # What the rules do not mean to stop still runs.
        small = call(agent, "transfer_funds", new_session(), 1, amount=5, to_account="x")
        assert small.status_code == 200, small.text
        assert call(agent, "create_record", new_session(), 1, tags=["dev"]).status_code == 200
    assert upstream_calls(proxy, "send_email") == []
    assert [c["args"]["amount"] for c in upstream_calls(proxy, "transfer_funds")] == [5]
    assert [c["args"] for c in upstream_calls(proxy, "create_record")] == [{"tags": ["dev"]}]


@pytest.mark.security
def test_rules_at_the_documented_limits_answer_fast_and_never_freeze_the_proxy(
    proxy: ProxyHarness,
) -> None:
    """100 rules of 60 terms over ~780 KB of a list (it froze the proxy for ~9 minutes):
    over the caps a rule fails closed at once; at the caps the step budget ends it, off the
    event loop; `/health` answers meanwhile."""
    condition = " or ".join(f'"prod-{n}" in tags' for n in range(60))
    set_rules(
        proxy,
        *({"name": f"r{n}", "tool": "*", "condition": condition, "action": "require"}
          for n in range(100)),
    )  # fmt: skip
    over_cap = [f"tag-{n:06d}" for n in range(60_000)]  # ~780 KB, 60,000 items
    at_cap = ["t" * 770 + f"{n:05d}" for n in range(1000)]  # ~780 KB, 1,000 items

    def heavy(step_and_tags: tuple[int, list[str]]) -> float:
        step, tags = step_and_tags
        with proxy.client(proxy.agent_key) as agent:
            started = time.perf_counter()
            asked = call(agent, "create_record", new_session(), step, tags=tags)
            took = time.perf_counter() - started
        assert asked.status_code == 202, asked.text  # failed closed: it waits for a person
        return took

    with ThreadPoolExecutor(max_workers=6) as pool, proxy.client() as probe:
        calls = pool.map(heavy, [(n, over_cap if n % 2 else at_cap) for n in range(1, 7)])
        pending = pool.submit(list, calls)
        health: list[float] = []
        while not pending.done() or not health:
            started = time.perf_counter()
            assert probe.get("/health").status_code == 200
            health.append(time.perf_counter() - started)
        answered = pending.result()
    print(f"heavy calls: worst {max(answered):.3f} s; /health: worst {max(health):.3f} s "
          f"over {len(health)} probes")  # fmt: skip
    assert max(answered) < 10.0, answered  # each well under a second when run alone
    assert max(health) < 2.5, max(health)
    with proxy.client(proxy.approver_key) as person:
        dry = person.post(
            "/policy/dry-run", json={"tool_name": "create_record", "args": {"tags": at_cap}}
        ).json()
    assert (dry["decision"], dry["rule"]["name"]) == ("approval", "r0")
    assert "steps" in dry["error"]
    assert upstream_calls(proxy, "create_record") == []
