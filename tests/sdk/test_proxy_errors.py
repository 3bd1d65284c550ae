"""`ProxyError`s are declared classes, one per error class a wire code names, and they
survive pickling; `AwaitingApprovalError` lives with the error tree but keeps its reference
home."""

from __future__ import annotations

import pickle

import httpx
import pytest

from undolog_sdk import _compat, client, decorators, errors
from undolog_sdk.client import ProxyError

# Every class `error_class_for_code` can return: the classes with a code of their own
# (`AuthMissing` and `InvalidUpstreamSignature` share `auth_failed` with their parent; the
# latter is a tool server's own refusal, never a proxy's answer), and the root for an unknown
# code.
CODED = sorted(
    {
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.UndoLogError)
    }
    - {errors.AuthMissing, errors.InvalidUpstreamSignature},
    key=lambda cls: cls.__name__,
)


def _answer(status: int, body: dict[str, object]) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("POST", "http://proxy/x"))


def _raised(status: int, body: dict[str, object]) -> ProxyError:
    with pytest.raises(ProxyError) as caught:
        client._raise_for_error(_answer(status, body))
    return caught.value


@pytest.mark.parametrize("base", CODED, ids=lambda cls: cls.__name__)
def test_each_error_class_has_a_declared_proxy_error_in_the_client_module(
    base: type[errors.UndoLogError],
) -> None:
    typed = client._typed_class(base)
    assert typed.__name__ == f"{base.__name__}ProxyError"
    assert typed.__module__ == "undolog_sdk.client"
    assert getattr(client, typed.__name__) is typed  # a module attribute: importable, picklable
    assert typed.__bases__ == (base, ProxyError)


@pytest.mark.parametrize(
    "base", [cls for cls in CODED if cls is not errors.UndoLogError], ids=lambda cls: cls.__name__
)
def test_an_error_answer_raises_the_proxy_error_of_its_code(
    base: type[errors.UndoLogError],
) -> None:
    exc = _raised(base.http_status, {"code": base.code, "message": "m", "request_id": "r"})
    assert isinstance(exc, base)
    assert isinstance(exc, httpx.HTTPStatusError)
    assert type(exc) is client._typed_class(base)
    assert (exc.code, exc.message, exc.request_id) == (base.code, "m", "r")


def test_an_unknown_code_raises_the_root_proxy_error() -> None:
    exc = _raised(418, {"code": "teapot", "message": "short and stout"})
    assert type(exc) is client.UndoLogErrorProxyError
    assert isinstance(exc, errors.UndoLogError)
    assert exc.code == "teapot"


def test_a_proxy_error_survives_pickling_with_its_fields() -> None:
    body = {"code": "in_progress", "message": "m", "effect_id": "e1", "retry_after": 3}
    exc = _raised(409, body)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is client.InProgressProxyError
    assert isinstance(again, errors.InProgress)
    assert (again.code, again.effect_id, again.retry_after, str(again)) == (
        "in_progress",
        "e1",
        3,
        "m",
    )
    assert again.response.status_code == 409
    assert again.body == body


def test_awaiting_approval_error_is_defined_with_the_tree_and_kept_at_its_reference_path() -> None:
    assert errors.AwaitingApprovalError is decorators.AwaitingApprovalError
    assert errors.AwaitingApprovalError.__module__ == "undolog_sdk.decorators"
    assert not issubclass(errors.AwaitingApprovalError, errors.UndoLogError)


def test_awaiting_approval_error_survives_pickling_with_its_fields() -> None:
    exc = errors.AwaitingApprovalError("ap-1", "delete_database", 4)
    exc.retry_after = 5
    again = pickle.loads(pickle.dumps(exc))
    assert (again.approval_id, again.tool_name, again.step_index, again.retry_after) == (
        "ap-1",
        "delete_database",
        4,
        5,
    )
    assert str(again) == str(exc)


def test_add_note_uses_the_exceptions_own_method_where_there_is_one() -> None:
    exc = RuntimeError("boom")
    _compat.add_note(exc, "first")
    _compat.add_note(exc, "second")
    assert exc.__notes__ == ["first", "second"]


def test_add_note_keeps_notes_where_exceptions_have_no_add_note() -> None:
    """Python 3.10's exceptions have no `add_note`: the notes go where 3.11 keeps them."""

    class Py310Error:  # stands in for a 3.10 exception: no add_note, no __notes__
        __notes__: list[str]

    exc = Py310Error()
    _compat.add_note(exc, "first")  # type: ignore[arg-type]
    _compat.add_note(exc, "second")  # type: ignore[arg-type]
    assert exc.__notes__ == ["first", "second"]
