"""An approval says who runs its call (`mode`: `proxy` or `sdk`), so a client such as the
dashboard offers to edit the arguments only where the API accepts them (docs/approvals.md,
"Approve with changes"). Both stores."""

from __future__ import annotations

import uuid

from tests.proxy.conftest import ProxyHarness

TOOL_CALL = "/mcp/tool_call"


def test_an_approval_names_the_mode_of_its_call(proxy: ProxyHarness) -> None:
    ids = {}
    with proxy.client(proxy.agent_key) as agent:
        for mode in ("proxy", "sdk"):
            body = {"session_id": str(uuid.uuid4()), "tool_name": "delete_database",
                    "step_index": 1, "args": {"db_name": mode}, "mode": mode}  # fmt: skip
            asked = agent.post(TOOL_CALL, json=body)
            assert asked.status_code == 202, asked.text
            ids[mode] = asked.json()["approval_id"]
    with proxy.client(proxy.approver_key) as person:
        listed = {a["id"]: a["mode"] for a in person.get("/approvals").json()}
        assert listed == {ids["proxy"]: "proxy", ids["sdk"]: "sdk"}
        for mode, approval_id in ids.items():
            assert person.get(f"/approvals/{approval_id}").json()["mode"] == mode
