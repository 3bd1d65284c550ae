"""Call signatures: the identity of one tool call, computed the same way on both sides of the wire.

A retried call must map to the same effect row, so the SDK and the proxy (written in Rust, using
serde_json) have to agree byte for byte on the hashed input. That input holds the arguments as
*canonical JSON*: compact, object keys sorted by code point, strings escaped the way serde_json
escapes them and floats printed the way serde_json prints an f64. Python's ``json`` module is close
but differs on floats, silently turns non-string keys into strings and accepts integers serde_json
cannot hold, so this module has its own small encoder, with the C string escaper of ``json``
(whose escaping is exactly serde_json's) on the hot path. Anything that serde_json could not
reproduce (NaN, infinities, integers outside [-2**63, 2**64 - 1], non-string keys, lone
surrogates, non-JSON types) is refused with a ``ValueError`` that names where it sits.
"""

from __future__ import annotations

import functools
import json.encoder
import math
import re
import struct
import uuid
from typing import Any, NoReturn

from blake3 import blake3

__all__ = ["call_signature", "canonical_json", "signature_of_canonical"]

_INT_MIN = -(2**63)  # i64::MIN
_INT_MAX = 2**64 - 1  # u64::MAX
_U32_MAX = 2**32 - 1

# Escapes '"', '\\' and U+0000..U+001F only (\b \t \n \f \r short, the rest as lowercase
# \u00xx) and leaves everything else, DEL and non-ASCII included, as it is: exactly the escape
# table of serde_json's `format_escaped_str_contents`. C-accelerated when `_json` is available.
_escape_str = json.encoder.encode_basestring

# The textual UUID forms (hyphenated, 32 hex digits, braced, URN), ASCII hex only. uuid.UUID alone
# is laxer: int(..., 16) lets through "_" between digits, a leading "+" or space, non-ASCII digits.
_HYPHENATED = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID_TEXT = re.compile(
    rf"{_HYPHENATED}|[0-9a-fA-F]{{32}}|\{{{_HYPHENATED}\}}|urn:uuid:{_HYPHENATED}"
)

_pack_step_and_len = struct.Struct("<II").pack
_pack_len = struct.Struct("<I").pack


class _Uncanonical(Exception):
    """Raised by the fast encoder; the slow locator then finds the path and the reason."""


# ---------------------------------------------------------------------------------------------
# Floats
#
# serde_json >= 1.0.147 (serde-rs/json PR #1304) prints an f64 with dtolnay's `zmij` crate
# (`zmij::Buffer::format_finite`, whose work is done by the private `write` function in
# zmij's src/lib.rs; before that release it used `ryu`, whose `pretty` module has the same
# layout except that it wrote no '+' in positive exponents). The rule, restated:
#
#   * digits: the shortest decimal string that reads back as the same double, the closest one
#     to the exact value when several are that short (Schubfach); Python's float repr produces
#     the same digits;
#   * let E be the decimal exponent of the first digit (value = d.ddd * 10**E):
#       - -5 <= E <= 15: plain notation; a whole number keeps a ".0" (1e15 -> 1000000000000000.0,
#         100.0 -> 100.0), 0 <= E < digits-1 puts the point inside (12.34), E < 0 pads with
#         zeros after "0." (1e-5 -> 0.00001, 0.000123 -> 0.000123);
#       - otherwise scientific: first digit, then "." and the other digits only if there are
#         any, then "e", then "+" or "-" and the exponent without leading zeros
#         (1e16 -> 1e+16, 1.5e-7 -> 1.5e-7, 5e-324 -> 5e-324, max -> 1.7976931348623157e+308);
#   * zero is "0.0", and negative zero keeps its sign: "-0.0".
#
# Python's repr uses plain notation only for -4 <= E <= 15 and pads the exponent to two digits
# ("1e-05", "1.5e-07"); its "e+16" spelling already matches. So repr is taken as is unless it
# is in exponent form, which is then rewritten.
# ---------------------------------------------------------------------------------------------

_float_repr = float.__repr__


def _format_float(value: float) -> str:
    text = _float_repr(value)
    if "e" in text or "n" in text:  # exponent form, or "inf" / "nan"
        return _format_float_slow(text)
    return text


def _format_float_slow(text: str) -> str:
    mantissa, sep, exponent_text = text.partition("e")
    if not sep:
        raise _Uncanonical(text)  # inf, -inf, nan
    exponent = int(exponent_text)
    if exponent == -5:
        # zmij still prints E = -5 in plain notation; repr already switched to "d.ddde-05".
        sign = "-" if mantissa[0] == "-" else ""
        digits = mantissa.lstrip("-").replace(".", "")
        return f"{sign}0.0000{digits}"
    return f"{mantissa}e{exponent_text[0]}{exponent_text[1:].lstrip('0')}"


# ---------------------------------------------------------------------------------------------
# Fast encoder: no path bookkeeping. Any problem raises (_Uncanonical, TypeError from the
# string escaper or from sorting mixed keys, RecursionError) and the caller hands the value to
# `_raise_located`, which walks it again slowly and reports where the problem is.
# ---------------------------------------------------------------------------------------------


def _encode(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _escape_str(value)
    if kind is dict:
        return _encode_dict(value)
    if kind is list or kind is tuple:
        return _encode_list(value)
    if kind is int:
        if _INT_MIN <= value <= _INT_MAX:
            return int.__repr__(value)
        raise _Uncanonical
    if kind is float:
        return _format_float(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return _encode_subclass(value)


def _encode_dict(value: dict[Any, Any]) -> str:
    if not value:
        return "{}"
    # Sorting str keys compares code points (not UTF-16 units), which is also the byte order of
    # their UTF-8 form: the order of serde_json's BTreeMap-backed Map. Distinct str keys never
    # compare equal, so sorting the items never compares two values.
    return (
        "{" + ",".join([f"{_escape_str(k)}:{_encode(v)}" for k, v in sorted(value.items())]) + "}"
    )


def _encode_list(value: list[Any] | tuple[Any, ...]) -> str:
    return "[" + ",".join([_encode(item) for item in value]) + "]"


def _encode_subclass(value: Any) -> str:
    # Subclasses of the JSON types (str and int enums, OrderedDict, ...) encode as their base
    # value; bool cannot be subclassed, so it never gets here.
    if isinstance(value, str):
        return _escape_str(value)
    if isinstance(value, int):
        if _INT_MIN <= value <= _INT_MAX:
            return int.__repr__(value)
        raise _Uncanonical
    if isinstance(value, float):
        return _format_float(value)
    if isinstance(value, dict):
        return _encode_dict(value)
    if isinstance(value, list | tuple):
        return _encode_list(value)
    raise _Uncanonical


# ---------------------------------------------------------------------------------------------
# Slow path: find the first offending value, in the order the encoder visits them.
# ---------------------------------------------------------------------------------------------


def _key_path(path: str, key: str) -> str:
    # ensure_ascii keeps lone surrogates printable in the message.
    return f"{path}[{json.dumps(key, ensure_ascii=True)}]"


def _describe_type(value: Any) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _string_problem(text: str) -> str | None:
    if text.isascii():
        return None
    for char in text:
        if "\ud800" <= char <= "\udfff":
            return f"lone surrogate U+{ord(char):04X}, which cannot be encoded as UTF-8"
    return None


def _scalar_problem(value: Any) -> str | None:
    """Why a non-container value cannot be canonicalized, or None when it can."""
    if value is None or value is True or value is False:
        return None
    if isinstance(value, str):
        problem = _string_problem(value)
        return None if problem is None else f"string contains a {problem}"
    if isinstance(value, int):
        if _INT_MIN <= value <= _INT_MAX:
            return None
        return f"integer {value} is outside [-2**63, 2**64 - 1]"
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"float {_float_repr(value)} has no JSON form"
    return (
        f"value of type {_describe_type(value)} is not JSON"
        " (use dict, list, tuple, str, int, float, bool or None)"
    )


def _locate(value: Any) -> tuple[str, str, int]:
    """Return (path, reason, max_depth) of the first problem; reason is "" if none was found."""
    on_path: set[int] = set()
    max_depth = 0
    # Work items: (value, path, depth, leaving). `leaving` marks the exit of a container.
    work: list[tuple[Any, str, int, bool]] = [(value, "$", 0, False)]
    while work:
        current, path, depth, leaving = work.pop()
        if leaving:
            on_path.discard(id(current))
            continue
        max_depth = max(max_depth, depth)
        if isinstance(current, dict):
            children: list[tuple[Any, str]] = []
            for key in current:
                if not isinstance(key, str):
                    return (
                        path,
                        f"object key {key!r} ({_describe_type(key)}) is not a string",
                        max_depth,
                    )
                problem = _string_problem(key)
                if problem is not None:
                    return _key_path(path, key), f"object key contains a {problem}", max_depth
            children = [(current[key], _key_path(path, key)) for key in sorted(current)]
        elif isinstance(current, list | tuple):
            children = [(item, f"{path}[{index}]") for index, item in enumerate(current)]
        else:
            problem = _scalar_problem(current)
            if problem is not None:
                return path, problem, max_depth
            continue
        if id(current) in on_path:
            return path, "circular reference (a container holds itself)", max_depth
        on_path.add(id(current))
        work.append((current, path, depth, True))
        work.extend(
            (child, child_path, depth + 1, False) for child, child_path in reversed(children)
        )
    return "", "", max_depth


def _raise_located(value: Any, cause: BaseException | None) -> NoReturn:
    path, reason, max_depth = _locate(value)
    if reason:
        raise ValueError(f"cannot canonicalize value at {path}: {reason}") from None
    if isinstance(cause, RecursionError):
        raise ValueError(
            f"cannot canonicalize value: nested too deeply ({max_depth} levels)"
        ) from None
    if cause is None:  # pragma: no cover - the locator checks everything the encoder does
        raise ValueError("cannot canonicalize value") from None
    # The locator found nothing wrong, so the failure is not about the value: let it through.
    raise cause


def _canonical_text(value: Any) -> str:
    try:
        return _encode(value)
    except (_Uncanonical, TypeError, RecursionError) as exc:
        _raise_located(value, exc)


def canonical_json(value: Any) -> str:
    """Return ``value`` as canonical JSON, exactly as the Rust proxy's serde_json writes it.

    Compact (no whitespace), object keys sorted by Unicode code point at every level, strings
    escaped like serde_json (only ``"``, ``\\`` and U+0000-U+001F), floats printed like
    serde_json's f64 (see the comment above ``_format_float``). Tuples encode as arrays.

    Raises:
        ValueError: the value cannot be canonicalized: NaN or an infinity, an integer outside
            [-2**63, 2**64 - 1], a non-string object key, a lone surrogate in a string or key,
            a type that is not JSON, a circular reference. The message names the path
            (``$["key"][0]``) of the offending value.
    """
    text = _canonical_text(value)
    if not text.isascii():  # O(1) in CPython; only non-ASCII text can hold a lone surrogate
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            _raise_located(value, None)
    return text


@functools.lru_cache(maxsize=4096)
def _session_bytes(session_id: str) -> bytes:
    if _UUID_TEXT.fullmatch(session_id) is None:
        raise ValueError(session_id)
    return uuid.UUID(session_id).bytes


def call_signature(session_id: str, step_index: int, tool_name: str, args: Any) -> str:
    """Return the BLAKE3-256 call signature of one tool call, as 64 lowercase hex characters.

    The hashed bytes are ``[session UUID, 16 bytes][step_index, u32 LE]``
    ``[len(tool_name), u32 LE][tool_name, UTF-8][len(args), u32 LE][canonical_json(args), UTF-8]``.

    Raises:
        ValueError: ``session_id`` is not a UUID, ``step_index`` is not an integer in
            [0, 2**32 - 1], ``tool_name`` is not encodable as UTF-8 (lone surrogate), or
            ``args`` cannot be canonicalized (see ``canonical_json``).
    """
    session, tool = _checked_head(session_id, step_index, tool_name)
    text = _canonical_text(args)
    try:
        payload = text.encode("utf-8")
    except UnicodeEncodeError:
        _raise_located(args, None)
    return _signature(session, step_index, tool, payload)


def signature_of_canonical(session_id: str, step_index: int, tool_name: str, args_json: str) -> str:
    """``call_signature`` of a call whose args are already canonical JSON: ``args_json`` must
    be what ``canonical_json(args)`` returned (it is hashed as it is, not checked), so a caller
    that needs both encodes the args once. Same bytes, same signature, same errors for the
    other arguments.
    """
    session, tool = _checked_head(session_id, step_index, tool_name)
    return _signature(session, step_index, tool, args_json.encode("utf-8"))


def _checked_head(session_id: str, step_index: int, tool_name: str) -> tuple[bytes, bytes]:
    """The session's 16 bytes and the tool name's UTF-8, or the ValueError that says why not."""
    try:
        session = _session_bytes(session_id)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"session_id must be a UUID string, got {session_id!r}") from None
    if type(step_index) is not int and (
        isinstance(step_index, bool) or not isinstance(step_index, int)
    ):
        raise ValueError(f"step_index must be an integer, got {_describe_type(step_index)}")
    if not 0 <= step_index <= _U32_MAX:
        raise ValueError(f"step_index must be in [0, 2**32 - 1], got {step_index}")
    try:
        tool = tool_name.encode("utf-8")
    except AttributeError:
        raise ValueError(f"tool_name must be a string, got {_describe_type(tool_name)}") from None
    except UnicodeEncodeError:
        raise ValueError(
            f"tool_name {tool_name!r} contains a lone surrogate and cannot be encoded as UTF-8"
        ) from None
    return session, tool


def _signature(session: bytes, step_index: int, tool: bytes, payload: bytes) -> str:
    if len(tool) > _U32_MAX or len(payload) > _U32_MAX:
        raise ValueError("tool_name and the canonical args must each fit in 2**32 - 1 bytes")
    # One contiguous buffer: for call-sized inputs a single hash call beats hashing in pieces.
    header = session + _pack_step_and_len(step_index, len(tool)) + tool + _pack_len(len(payload))
    return blake3(header + payload).hexdigest()
