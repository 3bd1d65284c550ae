"""The stricter tier wins: a call that declares a tier runs under the stricter of its code's
and the registry's (SAFE < COMPENSABLE < IRREVERSIBLE), with the compensation it declares.

The rule is a pure function (`engine/tiers.py`, `stricter_tier`), tested row by row; the
engine's intercept then applies it on both stores.
"""

from __future__ import annotations

import itertools
import uuid

import orjson
import pytest

from tests.engine.test_engine import Clock, events_of
from undolog.engine import Engine, Outcome
from undolog.engine.tiers import Declared, applied, declared
from undolog.store import Store, ToolRecord
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import CompensationDescriptor, ToolTier, stricter_tier

SAFE, COMPENSABLE, IRREVERSIBLE = ToolTier.SAFE, ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE
REGISTERED_UNDO = CompensationDescriptor.new("refund_charge", {"reason": "session rolled back"})
CODE_UNDO = CompensationDescriptor.new("refund_charge", {"reason": "trip not booked"})


def tool(tier: ToolTier, compensation: CompensationDescriptor | None = None) -> ToolRecord:
    comp = canonical_json(compensation.to_dict()) if compensation is not None else None
    return ToolRecord("org", "charge_card", tier.value, "1.0.0", comp, False, None, 1)


@pytest.mark.parametrize(
    ("first", "second", "stricter"),
    [
        (SAFE, SAFE, SAFE),
        (SAFE, COMPENSABLE, COMPENSABLE),
        (SAFE, IRREVERSIBLE, IRREVERSIBLE),
        (COMPENSABLE, SAFE, COMPENSABLE),
        (COMPENSABLE, COMPENSABLE, COMPENSABLE),
        (COMPENSABLE, IRREVERSIBLE, IRREVERSIBLE),
        (IRREVERSIBLE, SAFE, IRREVERSIBLE),
        (IRREVERSIBLE, COMPENSABLE, IRREVERSIBLE),
        (IRREVERSIBLE, IRREVERSIBLE, IRREVERSIBLE),
        (COMPENSABLE, None, COMPENSABLE),
    ],
)
def test_the_stricter_of_two_tiers_is_the_one_further_along_safe_compensable_irreversible(
    first: ToolTier, second: ToolTier | None, stricter: ToolTier
) -> None:
    assert stricter_tier(first, second) is stricter


@pytest.mark.security
@pytest.mark.parametrize(
    ("code", "registry"), list(itertools.product(ToolTier, ToolTier))
)  # fmt: skip
def test_a_call_never_runs_under_a_weaker_tier_than_its_code_or_the_registry_says(
    code: ToolTier, registry: ToolTier
) -> None:
    registered = tool(registry, REGISTERED_UNDO if registry.is_compensable else None)
    comp = CODE_UNDO if code.is_compensable else None
    result = applied(registered, Declared(code, canonical_json(comp.to_dict()) if comp else None))
    assert result.tool.tier == stricter_tier(code, registry).value
    assert (result.declared_tier, result.registered_tier) == (code, registry)
    assert result.tier_mismatch is (code is not registry)


def test_a_declared_compensation_replaces_the_registered_one_and_is_reported() -> None:
    code = canonical_json(CODE_UNDO.to_dict())
    result = applied(tool(COMPENSABLE, REGISTERED_UNDO), Declared(IRREVERSIBLE, code))
    assert result.tool.compensation_json == code
    assert result.compensation_mismatch
    same = applied(tool(COMPENSABLE, REGISTERED_UNDO), Declared(COMPENSABLE))
    assert same.tool == tool(COMPENSABLE, REGISTERED_UNDO)  # nothing declared: the registry's
    assert not same.compensation_mismatch and not same.tier_mismatch


def test_a_compensable_declaration_without_a_compensation_over_a_safe_tool_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        applied(tool(SAFE), Declared(COMPENSABLE))


@pytest.mark.parametrize(
    ("tier", "compensation"),
    [("dangerous", None), (None, {"fn_name": "x"}), ("safe", []), ("safe", {"nope": 1})],
)
def test_a_malformed_declaration_is_an_invalid_request(tier: object, compensation: object) -> None:
    with pytest.raises(InvalidRequest):
        declared(tier, compensation)


# -- the engine, both stores -----------------------------------------------------------------


@pytest.fixture
async def engine(store: Store, org_id: str) -> Engine:
    engine = Engine(store, lease_seconds=30, clock_us=Clock())
    await engine.ensure_org(org_id)
    await engine.register_tool(
        org_id, "charge_card", tier="compensable", compensation=REGISTERED_UNDO.to_dict()
    )
    await engine.register_tool(org_id, "wipe", tier="irreversible")
    return engine


@pytest.mark.security
async def test_an_irreversible_declaration_over_a_compensable_registration_waits_for_approval(
    engine: Engine, org_id: str
) -> None:
    session = str(uuid.uuid4())
    decision = await engine.intercept(
        org_id, session, "charge_card", {"cents": 5}, step_index=1, mode="sdk",
        declared_tier="irreversible", declared_compensation=CODE_UNDO.to_dict(),
    )  # fmt: skip
    assert decision.outcome is Outcome.AWAITING_APPROVAL
    assert decision.tool.tier == "irreversible"
    assert decision.applied is not None
    assert (decision.applied.declared_tier, decision.applied.registered_tier) == (
        IRREVERSIBLE,
        COMPENSABLE,
    )
    (event,) = [
        e for e in await events_of(engine, org_id, session) if e.type == "approval_required"
    ]
    payload = orjson.loads(event.payload_json)
    assert (payload["tier"], payload["declared_tier"], payload["registered_tier"]) == (
        "irreversible",
        "irreversible",
        "compensable",
    )
    view = await engine.session_view(org_id, session)
    (entry,) = view.undo_entries  # the code's compensation, with the code's arguments
    assert orjson.loads(entry.args_json) == {"reason": "trip not booked"}


@pytest.mark.security
async def test_a_safe_declaration_over_an_irreversible_registration_waits_for_approval(
    engine: Engine, org_id: str
) -> None:
    decision = await engine.intercept(
        org_id, str(uuid.uuid4()), "wipe", {}, step_index=1, mode="sdk", declared_tier="safe"
    )
    assert decision.outcome is Outcome.AWAITING_APPROVAL


async def test_a_compensable_declaration_runs_with_the_declared_compensation(
    engine: Engine, org_id: str
) -> None:
    session = str(uuid.uuid4())
    decision = await engine.intercept(
        org_id, session, "charge_card", {"cents": 5}, step_index=1, mode="sdk",
        declared_tier="compensable", declared_compensation=CODE_UNDO.to_dict(),
    )  # fmt: skip
    assert decision.outcome is Outcome.EXECUTE
    (entry,) = (await engine.session_view(org_id, session)).undo_entries
    assert orjson.loads(entry.args_json) == {"reason": "trip not booked"}
    (event,) = [
        e for e in await events_of(engine, org_id, session) if e.type == "effect_intercepted"
    ]
    payload = orjson.loads(event.payload_json)
    assert (payload["tier"], payload["declared_tier"], payload["registered_tier"]) == (
        "compensable",
        "compensable",
        "compensable",
    )


@pytest.mark.security
async def test_a_proxy_mode_call_cannot_name_the_compensation_the_proxy_runs(
    engine: Engine, org_id: str
) -> None:
    with pytest.raises(InvalidRequest):
        await engine.intercept(
            org_id, str(uuid.uuid4()), "charge_card", {}, step_index=1,
            declared_tier="compensable", declared_compensation={"fn_name": "delete_database"},
        )  # fmt: skip


async def test_a_call_that_declares_nothing_runs_under_the_registered_tier(
    engine: Engine, org_id: str
) -> None:
    decision = await engine.intercept(org_id, str(uuid.uuid4()), "charge_card", {}, step_index=1)
    assert decision.outcome is Outcome.EXECUTE and decision.applied is None
    assert decision.tool.tier == "compensable"
