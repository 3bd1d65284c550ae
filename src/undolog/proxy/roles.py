"""Who may use which route: the one permission table of the proxy.

Every authenticated request carries a principal (its key's org, id, name and role; see
`edge.py`). `allowed` answers whether the role may use the route; a route that is not in the
table is for `admin` keys only, so a route added without a line here is closed, not open.

- `agent`: tool calls (`/mcp/tool_call`, `/mcp`), the reads the SDK and an agent need, its
  sessions' rollback and complete, SDK commit/fail, and the claim/complete/fail of SDK
  compensations. Never an approval, a tool registration, a resolve. Only its own sessions
  (the ones its calls created), and what belongs to them: see `owners.py`.
- `approver`: approve and reject, every read, the dashboard, the policy rules (read) and
  their dry run, and rolling back or undoing a session (a person deciding to undo an agent's
  work; the key's name is recorded as who asked, `by` in the rollback's events).
- `admin`: everything, among it replacing the policy rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from undolog.engine.keys import Role
from undolog.engine.model import Actor

__all__ = ["PERMISSIONS", "Principal", "allowed", "route_roles"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: always from the key (or the key behind a dashboard session)."""

    org_id: str
    key_id: str
    key_name: str
    role: Role
    # Built once: the key resolver's cache hands the same principal to every request of a key.
    _actor: Actor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        agent = self.role is Role.AGENT
        actor = Actor(self.key_id, own_sessions_only=agent, key_name=self.key_name)
        object.__setattr__(self, "_actor", actor)

    @property
    def actor(self) -> Actor:
        """What the engine checks: an `agent` key is held to the sessions it created
        (`undolog.engine.owners`); approver and admin keys see the whole org."""
        return self._actor

    @property
    def decider(self) -> str:
        """How this principal is recorded as the decider of an approval or a resolve."""
        return f"key:{self.key_name}"


_AGENT = frozenset({Role.AGENT, Role.APPROVER, Role.ADMIN})  # agents, and everyone above
_APPROVER = frozenset({Role.APPROVER, Role.ADMIN})
_READ = frozenset({Role.AGENT, Role.APPROVER, Role.ADMIN})
_ADMIN = frozenset({Role.ADMIN})

# (method, route template) → roles. Admin holds every role's rights.
PERMISSIONS: dict[tuple[str, str], frozenset[Role]] = {
    ("POST", "/mcp/tool_call"): frozenset({Role.AGENT, Role.ADMIN}),
    ("GET", "/mcp"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/mcp"): frozenset({Role.AGENT, Role.ADMIN}),
    ("DELETE", "/mcp"): frozenset({Role.AGENT, Role.ADMIN}),
    ("GET", "/tools"): _READ,
    ("PUT", "/tools/{name}"): _ADMIN,
    ("GET", "/effects/{id}"): _READ,
    ("POST", "/effects/{id}/commit"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/effects/{id}/fail"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/effects/{id}/resolve"): _ADMIN,
    ("GET", "/sessions"): _READ,
    ("GET", "/sessions/{id}"): _READ,
    ("POST", "/sessions/{id}/rollback"): _AGENT,
    ("POST", "/sessions/{id}/complete"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/undo/{entry}/claim"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/undo/{entry}/complete"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/undo/{entry}/fail"): frozenset({Role.AGENT, Role.ADMIN}),
    ("POST", "/undo/{entry}/retry"): _ADMIN,
    ("POST", "/undo/{entry}/resolve"): _ADMIN,
    ("GET", "/approvals"): _APPROVER,
    ("GET", "/approvals/{id}"): _READ,
    ("POST", "/approvals/{id}/approve"): _APPROVER,
    ("POST", "/approvals/{id}/reject"): _APPROVER,
    ("POST", "/approvals//approve"): _APPROVER,
    ("POST", "/approvals//reject"): _APPROVER,
    ("GET", "/events"): _READ,
    ("GET", "/events/recent"): _READ,
    ("GET", "/overview"): _APPROVER,
    ("GET", "/policy/rules"): _APPROVER,
    ("PUT", "/policy/rules"): _ADMIN,
    ("POST", "/policy/dry-run"): _APPROVER,
}

_SEGMENT = re.compile(r"\{[^/}]+\}")


def _compile(template: str) -> re.Pattern[str]:
    parts = _SEGMENT.split(template)
    return re.compile("^" + "[^/]+".join(re.escape(p) for p in parts) + "$")


_MATCHERS: list[tuple[str, re.Pattern[str], frozenset[Role]]] = [
    (method, _compile(template), roles) for (method, template), roles in PERMISSIONS.items()
]


def route_roles(method: str, path: str) -> frozenset[Role]:
    """The roles that may call `method path` (only `admin` for a route not in the table)."""
    method = "GET" if method == "HEAD" else method
    for route_method, pattern, roles in _MATCHERS:
        if route_method == method and pattern.match(path):
            return roles
    return _ADMIN


def allowed(principal: Principal, method: str, path: str) -> bool:
    return principal.role in route_roles(method, path)
