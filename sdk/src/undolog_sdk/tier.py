"""Tool tiers and compensation descriptors: how dangerous a tool is, and how to undo it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from undolog_sdk.wire import unstorable

# `TIER_VALUES`, `COMPENSATION_LIMITS` and `check_compensation_integer` are for the server
# side (the config loaders); the public names stay those of the reference.
__all__ = ["CompensationDescriptor", "TierMismatchWarning", "ToolTier"]


class ToolTier(enum.Enum):
    """How a tool call is treated by UndoLog."""

    SAFE = "safe"
    """Read-only or idempotent: executes freely, no effect-log entry required."""
    COMPENSABLE = "compensable"
    """A write with a well-defined undo: its compensation is pushed before it runs."""
    IRREVERSIBLE = "irreversible"
    """Cannot be undone: waits for a human to approve it."""

    @property
    def is_safe(self) -> bool:
        return self is ToolTier.SAFE

    @property
    def is_compensable(self) -> bool:
        return self is ToolTier.COMPENSABLE

    @property
    def requires_approval(self) -> bool:
        return self is ToolTier.IRREVERSIBLE


# The tier values in order, for config loaders and schemas that list them.
TIER_VALUES: tuple[str, ...] = tuple(tier.value for tier in ToolTier)

# How strict each tier's gate is: SAFE < COMPENSABLE < IRREVERSIBLE.
_STRICTNESS = {tier: rank for rank, tier in enumerate(ToolTier)}


def stricter_tier(first: ToolTier, second: ToolTier | None) -> ToolTier:
    """The stricter of two tiers (SAFE < COMPENSABLE < IRREVERSIBLE); `second` None: `first`.

    When the tier a tool's code declares and the one the registry holds differ, the call runs
    under this one (the SDK and the engine both apply it): nothing lowers a gate.
    """
    if second is None or _STRICTNESS[first] >= _STRICTNESS[second]:
        return first
    return second


class TierMismatchWarning(UserWarning):
    """The tier (or compensation) a tool's code declares is not the one the registry holds.

    The call runs under the stricter tier, and with the compensation the code declares
    (docs/sdk.md, "Declared and registered tiers"); align the two to silence it.
    """


# Ranges a compensation's integers must stay in. The store keeps them in 32-bit columns; past
# these bounds a value is a mistake anyway (more retries than anyone waits for, a backoff
# longer than an hour), and one accepted at registration broke every later call of the tool.
COMPENSATION_LIMITS = {"max_retries": 1000, "retry_backoff_ms": 3_600_000}


def check_compensation_integer(name: str, value: object) -> int:
    """`value` if it is a whole number within `COMPENSATION_LIMITS[name]`.

    Raises:
        ValueError: a message naming the field and its range.
    """
    high = COMPENSATION_LIMITS[name]
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise ValueError(f"compensation.{name} must be a whole number from 0 to {high}")
    return value


@dataclass
class CompensationDescriptor:
    """The compensation to run when a COMPENSABLE call is rolled back.

    Attributes:
        fn_name: logical name matching the compensation registry.
        fn_version: semver version of the compensation function.
        args: arguments captured from the original call before execution.
        max_retries: retries before escalating to `compensation_failed`.
        retry_backoff_ms: delay between retries, in milliseconds.
        idempotent: the compensation honours its Idempotency-Key (the undo entry id), so a
            run whose outcome is unknown (its runner died, it timed out) may simply run again.
            Otherwise such an entry stops the rollback until an operator retries or resolves it.
    """

    fn_name: str
    fn_version: str = "1.0.0"
    args: dict[str, Any] = field(default_factory=dict)
    max_retries: int = 3
    retry_backoff_ms: int = 1000
    idempotent: bool = False

    @classmethod
    def new(cls, fn_name: str, args: dict[str, Any] | None = None) -> CompensationDescriptor:
        return cls(fn_name=fn_name, args=dict(args) if args else {})

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "fn_name": self.fn_name,
            "fn_version": self.fn_version,
            "args": self.args,
            "max_retries": self.max_retries,
            "retry_backoff_ms": self.retry_backoff_ms,
        }
        if self.idempotent:  # absent means false: descriptors written before it stay equal
            data["idempotent"] = True
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompensationDescriptor:
        """Build a descriptor from its JSON form; unknown keys are refused."""
        known = {"fn_name", "fn_version", "args", "max_retries", "retry_backoff_ms", "idempotent"}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown compensation fields: {sorted(unknown)}")
        if not isinstance(data.get("fn_name"), str) or not data["fn_name"]:
            raise ValueError("compensation.fn_name must be a non-empty string")
        args = data.get("args") or {}
        if not isinstance(args, dict):
            raise ValueError("compensation.args must be an object")
        fn_version = data.get("fn_version", "1.0.0")
        if not isinstance(fn_version, str):
            raise ValueError("compensation.fn_version must be a string")
        for name in ("fn_name", "fn_version"):
            if unstorable(data.get(name, "")):  # no store's text column can hold it
                raise ValueError(
                    f"compensation.{name} must not contain NUL characters or lone surrogates"
                )
        max_retries = data.get("max_retries", 3)
        backoff = data.get("retry_backoff_ms", 1000)
        check_compensation_integer("max_retries", max_retries)
        check_compensation_integer("retry_backoff_ms", backoff)
        idempotent = data.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise ValueError("compensation.idempotent must be true or false")
        return cls(
            fn_name=data["fn_name"],
            fn_version=fn_version,
            args=args,
            max_retries=max_retries,
            retry_backoff_ms=backoff,
            idempotent=idempotent,
        )
