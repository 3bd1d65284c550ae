"""The agent's HTTP client to the UndoLog proxy: intercept, commit, fail.

The SDK asks the proxy for a decision only (`"mode": "sdk"`): on Execute the agent runs the tool
itself and reports the outcome with `commit` / `fail`, which — unlike the reference, where they
were no-ops — are real calls, because otherwise a local execution would never be recorded.
Error answers become `ProxyError`s: `httpx.HTTPStatusError` subclasses that are also the
matching `UndoLogError` (so `except InProgress` and `except httpx.HTTPStatusError` both work).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from undolog_sdk import errors as _errors
from undolog_sdk.wire import CallStatus, ExecutionMode, Outcome

__all__ = ["InterceptResponse", "ProxyError", "UndoLogClient"]

DEFAULT_PROXY_URL = "http://localhost:8080"
DEFAULT_TIMEOUT = 30.0


@dataclass
class InterceptResponse:
    """The engine's decision for one call.

    | field           | Execute | Replay | AwaitingApproval |
    |-----------------|---------|--------|------------------|
    | `effect_id`     | ✓       | ✓      | ✓                |
    | `approval_id`   |         |        | ✓                |
    | `cached_result` |         | ✓      |                  |
    | `retry_after`   |         |        | ✓                |

    `retry_after` (seconds) is not in the reference: it is the proxy's hint for when to ask
    again about a call that awaits approval. On Execute and AwaitingApproval, `tier` is the
    tier the call runs under: the stricter of `declared_tier` (the code's) and
    `registered_tier` (the registry's).
    """

    outcome: str
    effect_id: str | None = None
    approval_id: str | None = None
    cached_result: dict[str, Any] | None = None
    retry_after: int | None = None
    tier: str | None = None
    declared_tier: str | None = None
    registered_tier: str | None = None


class ProxyError(httpx.HTTPStatusError):
    """An error answer of the proxy, with the fields of its error body.

    Each instance is also an instance of the `UndoLogError` subclass its `code` names
    (`InProgress`, `ToolNotRegistered`, ...), so it can be caught either way.
    """

    code: str
    message: str
    request_id: str | None
    retry_after: int | None
    body: dict[str, Any]

    def __reduce__(self) -> tuple[Any, ...]:
        # The UndoLogError parents' __init__ take their own fields, not the message: rebuild
        # from the instance's attributes instead of calling the class with `args`.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


# One ProxyError per error class a wire code names (`errors.error_class_for_code`), the
# UndoLogError base first: its __init__ is never run (fields are set by hand), and httpx's
# __init__ chain then ends at Exception without passing through it.


class UndoLogErrorProxyError(_errors.UndoLogError, ProxyError):
    pass


class ToolNotRegisteredProxyError(_errors.ToolNotRegistered, ProxyError):
    pass


class DuplicateSignatureProxyError(_errors.DuplicateSignature, ProxyError):
    pass


class InvalidStateTransitionProxyError(_errors.InvalidStateTransition, ProxyError):
    pass


class NotExecutingProxyError(_errors.NotExecuting, ProxyError):
    pass


class CompensationFailedProxyError(_errors.CompensationFailed, ProxyError):
    pass


class EmptyUndoStackProxyError(_errors.EmptyUndoStack, ProxyError):
    pass


class CompensationRegisteredTooLateProxyError(_errors.CompensationRegisteredTooLate, ProxyError):
    pass


class ApprovalAlreadyResolvedProxyError(_errors.ApprovalAlreadyResolved, ProxyError):
    pass


class ApprovalTimedOutProxyError(_errors.ApprovalTimedOut, ProxyError):
    pass


class ApprovalArgsChangedProxyError(_errors.ApprovalArgsChanged, ProxyError):
    pass


class AdvisoryLockTimeoutProxyError(_errors.AdvisoryLockTimeout, ProxyError):
    pass


class DatabaseProxyError(_errors.Database, ProxyError):
    pass


class SerializationProxyError(_errors.Serialization, ProxyError):
    pass


class InternalProxyError(_errors.Internal, ProxyError):
    pass


class InvalidRequestProxyError(_errors.InvalidRequest, ProxyError):
    pass


class AuthFailedProxyError(_errors.AuthFailed, ProxyError):
    pass


class ForbiddenProxyError(_errors.Forbidden, ProxyError):
    pass


class PolicyDeniedProxyError(_errors.PolicyDenied, ProxyError):
    pass


class NotFoundProxyError(_errors.NotFound, ProxyError):
    pass


class MethodNotAllowedProxyError(_errors.MethodNotAllowed, ProxyError):
    pass


class PayloadTooLargeProxyError(_errors.PayloadTooLarge, ProxyError):
    pass


# `retry_after` is an int on InProgress and `int | None` on ProxyError: the proxy's InProgress
# answer always carries it, and a body without it leaves None (as on any ProxyError).
class InProgressProxyError(_errors.InProgress, ProxyError):  # type: ignore[misc]
    pass


class ClaimNotHeldProxyError(_errors.ClaimNotHeld, ProxyError):
    pass


# `retry_after` is an int on RateLimited and `int | None` on ProxyError: the proxy's RateLimited
# answer always carries it, and a body without it leaves None (as on any ProxyError).
class DependentEffectsProxyError(_errors.DependentEffects, ProxyError):
    pass


class RateLimitedProxyError(_errors.RateLimited, ProxyError):  # type: ignore[misc]
    pass


class EffectInDoubtProxyError(_errors.EffectInDoubt, ProxyError):
    pass


class SessionClosedProxyError(_errors.SessionClosed, ProxyError):
    pass


class ApprovalRejectedProxyError(_errors.ApprovalRejected, ProxyError):
    pass


class InterceptFailedProxyError(_errors.InterceptFailed, ProxyError):
    pass


class ToolErrorProxyError(_errors.ToolError, ProxyError):
    pass


class CommitFailedProxyError(_errors.CommitFailed, ProxyError):
    pass


_TYPED: dict[type[_errors.UndoLogError], type[ProxyError]] = {
    cls.__bases__[0]: cls
    for cls in (
        UndoLogErrorProxyError,
        ToolNotRegisteredProxyError,
        DuplicateSignatureProxyError,
        InvalidStateTransitionProxyError,
        NotExecutingProxyError,
        CompensationFailedProxyError,
        EmptyUndoStackProxyError,
        CompensationRegisteredTooLateProxyError,
        ApprovalAlreadyResolvedProxyError,
        ApprovalTimedOutProxyError,
        ApprovalArgsChangedProxyError,
        AdvisoryLockTimeoutProxyError,
        DatabaseProxyError,
        SerializationProxyError,
        InternalProxyError,
        InvalidRequestProxyError,
        AuthFailedProxyError,
        ForbiddenProxyError,
        PolicyDeniedProxyError,
        NotFoundProxyError,
        MethodNotAllowedProxyError,
        PayloadTooLargeProxyError,
        InProgressProxyError,
        ClaimNotHeldProxyError,
        DependentEffectsProxyError,
        RateLimitedProxyError,
        EffectInDoubtProxyError,
        SessionClosedProxyError,
        ApprovalRejectedProxyError,
        InterceptFailedProxyError,
        ToolErrorProxyError,
        CommitFailedProxyError,
    )
}


def _typed_class(base: type[_errors.UndoLogError]) -> type[ProxyError]:
    return _TYPED.get(base, UndoLogErrorProxyError)


def _rebuild(cls: type[ProxyError], args: tuple[Any, ...], state: dict[str, Any]) -> ProxyError:
    """Unpickle a `ProxyError` without running an `__init__` (see `ProxyError.__reduce__`)."""
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


# Body keys never copied onto the exception: ours, and httpx's own attributes.
_RESERVED_FIELDS = frozenset(
    {"code", "message", "request_id", "timestamp", "retry_after", "body", "request", "response",
     "args", "with_traceback", "add_note"}
)  # fmt: skip


def _tiers_of(data: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """`tier`, `declared_tier` and `registered_tier` of an intercept answer (None if absent)."""

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    return text("tier"), text("declared_tier"), text("registered_tier")


def _code_of(response: httpx.Response) -> str | None:
    """The `code` of an error answer, if it has one."""
    try:
        body = response.json()
    except ValueError:
        return None
    return str(body.get("code")) if isinstance(body, dict) else None


def _raise_for_error(response: httpx.Response) -> None:
    """Turn a proxy error answer into a typed `ProxyError`."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = str(body.get("code") or "http_error")
    message = str(body.get("message") or response.text or f"HTTP {response.status_code}")
    cls = _typed_class(_errors.error_class_for_code(code))
    exc: ProxyError = cls.__new__(cls)
    httpx.HTTPStatusError.__init__(exc, message, request=response.request, response=response)
    exc.code = code
    exc.message = message
    exc.request_id = body.get("request_id") or response.headers.get("x-request-id")
    retry_after = body.get("retry_after")
    exc.retry_after = retry_after if isinstance(retry_after, int) else None
    exc.body = body
    # The structured fields of the matching UndoLogError (effect_id, approval_id, ...).
    for name, value in body.items():
        if name not in _RESERVED_FIELDS and name.isidentifier():
            setattr(exc, name, value)
    raise exc


class UndoLogClient:
    """Async HTTP client for the UndoLog proxy.

    Args:
        proxy_url: base URL of the proxy; falls back to `UNDOLOG_PROXY_URL`, then
            `http://localhost:8080`.
        http_client: a pre-configured `httpx.AsyncClient` (its base URL is used as is). If
            omitted, one is created with `base_url=proxy_url` and `timeout=30.0`.
        api_key: the org's API key, sent as `X-Api-Key`; falls back to `UNDOLOG_API_KEY`.
    """

    def __init__(
        self,
        proxy_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        *,
        api_key: str | None = None,
    ) -> None:
        self.proxy_url = proxy_url or os.environ.get("UNDOLOG_PROXY_URL") or DEFAULT_PROXY_URL
        self.api_key = api_key if api_key is not None else os.environ.get("UNDOLOG_API_KEY")
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(
            base_url=self.proxy_url, timeout=DEFAULT_TIMEOUT
        )
        self._registered: set[tuple[str, str]] = set()
        # The registry as `GET /tools` listed it, read once per org by this client.
        self._tools: dict[str, dict[str, dict[str, Any]]] = {}
        self._warned: set[tuple[str, str]] = set()  # (org, tool) mismatches warned about

    def _headers(self, org_id: str, session_id: str | None = None) -> dict[str, str]:
        headers = {"X-UndoLog-Org-Id": org_id}
        if session_id is not None:
            headers["X-UndoLog-Session-Id"] = session_id
        if self.api_key:
            headers["X-Api-Key"] = self.api_key
        return headers

    async def _post(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> httpx.Response:
        response = await self._http.post(path, json=body, headers=headers)
        if response.status_code >= 400:
            _raise_for_error(response)
        return response

    async def intercept(
        self,
        org_id: str,
        session_id: str,
        tool_name: str,
        step_index: int,
        args: dict[str, Any],
        *,
        declared_tier: str | None = None,
        compensation: dict[str, Any] | None = None,
    ) -> InterceptResponse:
        """Ask the engine what to do with one call (`POST /mcp/tool_call`, SDK mode).

        `declared_tier` and `compensation` are what the tool's code declares: the call runs
        under the stricter of that tier and the registry's, and is undone by the declared
        compensation if given (docs/sdk.md, "Declared and registered tiers").

        Raises:
            ProxyError (an httpx.HTTPStatusError): the proxy answered with an error.
            httpx.RequestError: the proxy could not be reached.
        """
        body: dict[str, Any] = {
            "session_id": session_id,
            "tool_name": tool_name,
            "step_index": step_index,
            "args": args,
            "mode": ExecutionMode.SDK.value,
        }
        if declared_tier is not None:
            body["declared_tier"] = declared_tier
        if compensation is not None:
            body["declared_compensation"] = compensation
        response = await self._post("/mcp/tool_call", body, self._headers(org_id, session_id))
        data = response.json()
        status = data.get("status")
        if status == CallStatus.REPLAYED:
            return InterceptResponse(
                Outcome.REPLAY, data.get("effect_id"), None, data.get("result")
            )
        if status == CallStatus.PENDING_APPROVAL:
            retry_after = data.get("retry_after")
            return InterceptResponse(
                Outcome.AWAITING_APPROVAL,
                data.get("effect_id"),
                data.get("approval_id"),
                None,
                retry_after if isinstance(retry_after, int) else None,
                *_tiers_of(data),
            )
        if status == CallStatus.EXECUTE:
            return InterceptResponse(
                Outcome.EXECUTE, data.get("effect_id"), None, None, None, *_tiers_of(data)
            )
        if status == CallStatus.EXECUTED:  # a SAFE tool run by the proxy: nothing to do locally
            return InterceptResponse(
                Outcome.REPLAY, data.get("effect_id"), None, data.get("result")
            )
        raise _errors.Internal(f"unexpected intercept answer: {data!r}")

    async def commit(
        self, org_id: str, session_id: str, effect_id: str, result: dict[str, Any]
    ) -> None:
        """Record the result of a call the agent executed (`POST /effects/{id}/commit`)."""
        await self._post(
            f"/effects/{effect_id}/commit", {"result": result}, self._headers(org_id, session_id)
        )

    async def fail(self, org_id: str, session_id: str, effect_id: str, error: str) -> None:
        """Record the failure of a call the agent executed (`POST /effects/{id}/fail`)."""
        await self._post(
            f"/effects/{effect_id}/fail", {"error": error}, self._headers(org_id, session_id)
        )

    async def registered_tool(self, org_id: str, tool_name: str) -> dict[str, Any] | None:
        """The registry's entry for a tool (`tier`, `compensation`, ...), or None if the org
        has none. The registry is listed (`GET /tools`) once per client and org: a tool
        registered or changed later is seen by clients created after that."""
        tools = self._tools.get(org_id)
        if tools is None:
            response = await self._http.get("/tools", headers=self._headers(org_id))
            if response.status_code >= 400:
                _raise_for_error(response)
            listed = response.json()
            tools = {t["name"]: t for t in listed if isinstance(t, dict) and "name" in t}
            self._tools[org_id] = tools
        return tools.get(tool_name)

    async def ensure_tool(
        self,
        org_id: str,
        tool_name: str,
        tier: str,
        compensation: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Register a tool the registry does not hold yet; done once per client by
        `@undolog_tool`. A registered tool is left as it is (its registration is not
        replaced: a call runs under the stricter of its code's tier and the registry's).

        Returns the registry's entry found (None: the tool was registered now).

        Raises:
            Forbidden: the tool is not registered and the key may not register it (an
                `agent` key).
        """
        entry = await self.registered_tool(org_id, tool_name)
        if entry is None and (org_id, tool_name) not in self._registered:
            await self.register_tool(org_id, tool_name, tier, compensation)
            self._tools.setdefault(org_id, {})[tool_name] = {
                "name": tool_name, "tier": tier, "compensation": compensation,
            }  # fmt: skip
        return entry

    async def register_tool(
        self,
        org_id: str,
        tool_name: str,
        tier: str,
        compensation: dict[str, Any] | None = None,
    ) -> None:
        """Register (or replace) a tool (`PUT /tools/{name}`), once per client;
        `@undolog_tool` uses `ensure_tool`, which calls this only for a tool not registered.

        An `agent` key may not register tools (`forbidden`): then the tool must already be
        registered (by an admin or the config), whose registration is what applies — this
        checks it is there and raises the `forbidden` error if it is not.
        """
        if (org_id, tool_name) in self._registered:
            return
        body: dict[str, Any] = {"tier": tier}
        if compensation is not None:
            body["compensation"] = compensation
        response = await self._http.put(
            f"/tools/{tool_name}", json=body, headers=self._headers(org_id)
        )
        if response.status_code == 403 and _code_of(response) == _errors.Forbidden.code:
            listed = await self._http.get("/tools", headers=self._headers(org_id))
            names = {t.get("name") for t in listed.json()} if listed.status_code == 200 else set()
            if tool_name not in names:
                _raise_for_error(response)
        elif response.status_code >= 400:
            _raise_for_error(response)
        self._registered.add((org_id, tool_name))

    async def _call(
        self, method: str, path: str, org_id: str, body: Any = None, *, outcome: bool = False
    ) -> Any:
        """One REST call; an error answer raises, unless `outcome` and it reports one."""
        response = await self._http.request(method, path, json=body, headers=self._headers(org_id))
        if response.status_code >= 400:
            data = response.json() if outcome else None
            if not (isinstance(data, dict) and "outcome" in data):
                _raise_for_error(response)
        return response.json()

    async def rollback_session(
        self, org_id: str, session_id: str, selection: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Ask the proxy to unwind the session (`POST /sessions/{id}/rollback`), or with
        `selection` (`{"entries": [...]}` or `{"after_step": N}`, and `"force"`) to undo
        only those entries and keep the session open.

        Returns the answer body whatever its outcome (`compensated`, `empty_undo_stack`,
        `waiting_for_runner`, `compensation_failed`, `in_progress`, `effect_in_doubt`).
        """
        data: dict[str, Any] = await self._call(
            "POST", f"/sessions/{session_id}/rollback", org_id, selection, outcome=True
        )
        return data

    async def get_approval(self, org_id: str, approval_id: str) -> dict[str, Any]:
        """One approval with its `status` (`GET /approvals/{id}`)."""
        data: dict[str, Any] = await self._call("GET", f"/approvals/{approval_id}", org_id)
        return data

    async def complete_session(self, org_id: str, session_id: str) -> None:
        """Mark the session completed (`POST /sessions/{id}/complete`)."""
        await self._call("POST", f"/sessions/{session_id}/complete", org_id)

    async def claim_undo(self, org_id: str, entry_id: str) -> dict[str, Any]:
        """Claim an undo entry the SDK runs (`POST /undo/{entry}/claim`); the answer's
        `claim_token` must accompany the reports below."""
        data: dict[str, Any] = await self._call("POST", f"/undo/{entry_id}/claim", org_id)
        return data

    async def complete_undo(self, org_id: str, entry_id: str, claim_token: str) -> None:
        """Report that the claimed compensation succeeded (`ClaimNotHeld` if the claim was
        lost: another runner claimed the entry after this claim's lease lapsed)."""
        await self._call("POST", f"/undo/{entry_id}/complete", org_id, {"claim_token": claim_token})

    async def fail_undo(self, org_id: str, entry_id: str, error: str, claim_token: str) -> None:
        """Report one failed attempt; the last one raises `CompensationFailed`."""
        await self._call(
            "POST", f"/undo/{entry_id}/fail", org_id, {"error": error, "claim_token": claim_token}
        )

    async def aclose(self) -> None:
        """Close the underlying HTTP client (only if this client created it)."""
        if self._owns_client:
            await self._http.aclose()


_default_client: UndoLogClient | None = None


def default_client() -> UndoLogClient:
    """The process-wide client used when none is given (to `@undolog_tool` or a session),
    created on first use from the environment (`UNDOLOG_PROXY_URL`, `UNDOLOG_API_KEY`)."""
    global _default_client
    if _default_client is None:
        _default_client = UndoLogClient()
    return _default_client
