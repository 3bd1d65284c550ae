"""The tier a call runs under when its code declares one: the stricter of code and registry.

An SDK-executed call carries the tier its code declares (`@undolog_tool(tier=...)`) and, for a
compensable tool, its compensation. The registry may hold another tier (an admin registered the
tool, or an older version of the code did). The call runs under the stricter of the two (SAFE <
COMPENSABLE < IRREVERSIBLE), so nothing an agent sends lowers a gate and no registry lowers the
gate the code asks for; a compensation the call declares is the one recorded (and run on
rollback), since it is what the developer wrote next to the function it undoes. Pure functions:
the engine applies them to the registry's (cached) record, with no store round trip.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from undolog.store.records import ToolRecord
from undolog_sdk.errors import InvalidRequest
from undolog_sdk.signature import canonical_json
from undolog_sdk.tier import CompensationDescriptor, ToolTier, stricter_tier

__all__ = ["Applied", "Declared", "applied", "declared"]


@dataclass(frozen=True, slots=True)
class Declared:
    """What a call's code declares: its tier, and its compensation (canonical JSON) if any."""

    tier: ToolTier
    compensation_json: str | None = None


@dataclass(frozen=True, slots=True)
class Applied:
    """The tool as the call runs it, and what it took from where.

    `tool`: the registry's record with the stricter tier and the compensation that applies.
    `registered_tier`: the registry's. `compensation_mismatch`: the code declared a
    compensation other than the registry's (the code's is the one used).
    """

    tool: ToolRecord
    declared_tier: ToolTier
    registered_tier: ToolTier
    compensation_mismatch: bool

    @property
    def tier_mismatch(self) -> bool:
        return self.declared_tier is not self.registered_tier


def declared(tier: Any, compensation: Any) -> Declared | None:
    """A call's declaration, checked; None when it declares no tier.

    Raises:
        InvalidRequest: an unknown tier, a compensation without a tier, a malformed
            compensation.
    """
    if tier is None:
        if compensation is not None:
            raise InvalidRequest("declared_compensation needs a declared_tier")
        return None
    try:
        declared_tier = ToolTier(tier)
    except ValueError:
        raise InvalidRequest(
            f"unknown declared_tier {tier!r}: expected one of safe, compensable, irreversible"
        ) from None
    if compensation is None:
        return Declared(declared_tier)
    if not isinstance(compensation, dict):
        raise InvalidRequest("declared_compensation must be an object")
    try:
        descriptor = CompensationDescriptor.from_dict(compensation)
        compensation_json = canonical_json(descriptor.to_dict())
    except ValueError as exc:
        raise InvalidRequest(f"invalid declared_compensation: {exc}") from None
    return Declared(declared_tier, compensation_json)


def applied(tool: ToolRecord, declaration: Declared) -> Applied:
    """The registry's `tool` as a call that declares `declaration` runs it: the stricter
    tier, and the declared compensation when there is one (else the registry's).

    Raises:
        InvalidRequest: the call would run COMPENSABLE with no compensation from anyone
            (code declared COMPENSABLE without one over a SAFE registration).
    """
    return _applied(tool, declaration.tier, declaration.compensation_json)


@functools.lru_cache(maxsize=4096)
def _applied(tool: ToolRecord, tier: ToolTier, compensation_json: str | None) -> Applied:
    # Cached: a tool's calls declare the same thing each time, and its record is reused from
    # the registry's cache, so the common call pays one dict lookup.
    registered = ToolTier(tool.tier)
    effective = stricter_tier(registered, tier)
    mismatch = compensation_json is not None and compensation_json != tool.compensation_json
    compensation = compensation_json if compensation_json is not None else tool.compensation_json
    if effective.is_compensable and compensation is None:
        raise InvalidRequest(
            f"tool '{tool.name}' is declared compensable: declare its compensation"
        )
    if effective.value == tool.tier and compensation == tool.compensation_json:
        return Applied(tool, tier, registered, mismatch)
    run = dataclasses.replace(tool, tier=effective.value, compensation_json=compensation)
    return Applied(run, tier, registered, mismatch)
