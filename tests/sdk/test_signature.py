"""Canonical JSON and call signatures must match the Rust proxy's serde_json byte for byte.

The float vectors follow the layout serde_json >= 1.0.147 gets from the `zmij` crate: plain
notation for decimal exponents -5..15 (whole numbers keep ".0"), otherwise `d.ddde[+-]N` with no
leading zeros in the exponent; digits are the shortest that round-trip.
"""

from __future__ import annotations

import collections
import decimal
import enum
import math
import random
import re
import struct
import uuid
from typing import Any

import pytest
from blake3 import blake3

from undolog_sdk.signature import call_signature, canonical_json, signature_of_canonical

SESSION = "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f"
SESSION_BYTES = bytes.fromhex("6f1c2d3e4b5a4c6d8e7f9a0b1c2d3e4f")
HEX64 = re.compile(r"[0-9a-f]{64}")


def _from_bits(bits: int) -> float:
    value: float = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return value


# --------------------------------------------------------------------------------- floats


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, "0.0"),
        (1.0, "1.0"),
        (100.0, "100.0"),
        (123456789012345.0, "123456789012345.0"),
        (1e15, "1000000000000000.0"),
        (9999999999999998.0, "9999999999999998.0"),  # largest double below 1e16
        (12.34, "12.34"),
        (1.5, "1.5"),
        (123456.789, "123456.789"),
        (1234567890123.4568, "1234567890123.4568"),
        (0.5, "0.5"),
        (0.1, "0.1"),
        (0.000123, "0.000123"),
        (0.0001, "0.0001"),
        (1e-5, "0.00001"),  # repr says 1e-05; serde_json stays plain down to 1e-5
        (1.2345e-5, "0.000012345"),
        (9.999e-5, "0.00009999"),
        (-1e-5, "-0.00001"),
        (-1.5, "-1.5"),
        (-1e15, "-1000000000000000.0"),
    ],
)
def test_floats_between_1e_minus_5_and_1e16_print_as_plain_decimals(
    value: float, expected: str
) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e16, "1e+16"),
        (1.5e16, "1.5e+16"),
        (12345678901234568.0, "1.2345678901234568e+16"),
        (123456789012345680.0, "1.2345678901234568e+17"),
        (1.2345e20, "1.2345e+20"),
        (1e21, "1e+21"),
        (1e22, "1e+22"),
        (1e23, "1e+23"),
        (1e100, "1e+100"),
        (3.439070283483335e35, "3.439070283483335e+35"),
        (6.079537928711555e61, "6.079537928711555e+61"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-1e16, "-1e+16"),
        (-1.7976931348623157e308, "-1.7976931348623157e+308"),
    ],
)
def test_floats_from_1e16_up_use_an_exponent_with_a_plus_sign(value: float, expected: str) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1e-6, "1e-6"),
        (9.999e-6, "9.999e-6"),
        (1.5e-7, "1.5e-7"),
        (1e-7, "1e-7"),
        (1.2345e-10, "1.2345e-10"),
        (6.606854224493745e-17, "6.606854224493745e-17"),
        (6.62607015e-34, "6.62607015e-34"),
        (1e-100, "1e-100"),
        (-4.932096661796888e-226, "-4.932096661796888e-226"),
        (-1e-6, "-1e-6"),
    ],
)
def test_floats_below_1e_minus_5_use_an_exponent_without_leading_zeros(
    value: float, expected: str
) -> None:
    assert canonical_json(value) == expected


def test_neighbours_of_the_notation_boundaries_switch_notation_exactly_there() -> None:
    assert canonical_json(math.nextafter(1e16, 0.0)) == "9999999999999998.0"
    assert canonical_json(math.nextafter(1e16, math.inf)) == "1.0000000000000002e+16"
    assert canonical_json(math.nextafter(1e-5, 0.0)) == "9.999999999999999e-6"
    assert canonical_json(math.nextafter(1e-5, math.inf)) == "0.000010000000000000003"


def test_negative_zero_keeps_its_sign() -> None:
    assert canonical_json(-0.0) == "-0.0"
    assert canonical_json(0.0) == "0.0"
    assert canonical_json([0.0, -0.0]) == "[0.0,-0.0]"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5e-324, "5e-324"),  # smallest subnormal
        (-5e-324, "-5e-324"),
        (1e-323, "1e-323"),
        (1.2e-322, "1.2e-322"),
        (1.234e-320, "1.234e-320"),
        (_from_bits(0x000FFFFFFFFFFFFF), "2.225073858507201e-308"),  # largest subnormal
        (2.2250738585072014e-308, "2.2250738585072014e-308"),  # smallest normal
    ],
)
def test_subnormals_print_their_shortest_digits_in_exponent_form(
    value: float, expected: str
) -> None:
    assert canonical_json(value) == expected


def test_floats_use_the_shortest_digits_that_round_trip() -> None:
    assert canonical_json(0.1 + 0.2) == "0.30000000000000004"
    assert canonical_json(1 / 3) == "0.3333333333333333"
    assert canonical_json(2 / 3) == "0.6666666666666666"
    assert canonical_json(2.0**-1074 * 3) == "1.5e-323"


def test_whole_floats_stay_floats_and_do_not_become_integers() -> None:
    assert canonical_json([1.0, 1]) == "[1.0,1]"
    assert canonical_json({"n": 2.0**53}) == '{"n":9007199254740992.0}'


def _decimal_exponent(text: str) -> int:
    return decimal.Decimal(text).adjusted()


def _round_trips(candidate: decimal.Decimal, value: float) -> bool:
    return float(candidate) == value


def test_random_bit_patterns_round_trip_with_shortest_digits_in_the_right_notation() -> None:
    rng = random.Random(0)
    checked = 0
    while checked < 400:
        value = _from_bits(rng.getrandbits(64))
        if not math.isfinite(value):
            continue
        checked += 1
        text = canonical_json(value)
        assert float(text) == value, text
        assert math.copysign(1.0, float(text)) == math.copysign(1.0, value)
        if value == 0.0:
            continue
        exponent = _decimal_exponent(text)
        if -5 <= exponent <= 15:
            assert re.fullmatch(r"-?\d+\.\d+", text), text
        else:
            assert re.fullmatch(r"-?\d(\.\d*[1-9])?e[+-][1-9]\d*", text), text
            assert ("e+" in text) == (exponent > 0), text
        # Shortest: neither neighbouring decimal with one digit fewer reads back as the value.
        digits = len(decimal.Decimal(text).as_tuple().digits)
        if digits > 1:
            exact = decimal.Decimal(value)
            quantum = decimal.Decimal(1).scaleb(exact.adjusted() - (digits - 2))
            for rounding in (decimal.ROUND_FLOOR, decimal.ROUND_CEILING):
                shorter = exact.quantize(quantum, rounding=rounding)
                assert not _round_trips(shorter, value), (text, shorter)


# -------------------------------------------------------------------------------- strings


@pytest.mark.parametrize(
    ("char", "escaped"),
    [
        ("\b", "\\b"),
        ("\t", "\\t"),
        ("\n", "\\n"),
        ("\f", "\\f"),
        ("\r", "\\r"),
    ],
)
def test_the_five_short_escapes_are_used_for_their_control_characters(
    char: str, escaped: str
) -> None:
    assert canonical_json(char) == f'"{escaped}"'


def test_other_control_characters_are_escaped_as_lowercase_u00xx() -> None:
    short = {0x08, 0x09, 0x0A, 0x0C, 0x0D}
    for code in range(0x20):
        if code in short:
            continue
        assert (
            canonical_json(chr(code))
            == '"\\u00' + "0123456789abcdef"[code >> 4] + ("0123456789abcdef"[code & 0xF]) + '"'
        )
    assert canonical_json("\x00") == '"\\u0000"'
    assert canonical_json("\x0b") == '"\\u000b"'
    assert canonical_json("\x1b") == '"\\u001b"'
    assert canonical_json("\x1f") == '"\\u001f"'


def test_quote_and_backslash_are_escaped_and_slash_is_not() -> None:
    assert canonical_json('say "hi"') == '"say \\"hi\\""'
    assert canonical_json("C:\\dir") == '"C:\\\\dir"'
    assert canonical_json("a/b") == '"a/b"'


def test_del_and_non_ascii_characters_are_written_raw() -> None:
    assert canonical_json("\x7f") == '"\x7f"'
    assert canonical_json("\x80\xa0é") == '"\x80\xa0é"'
    assert canonical_json("\u2028\u2029") == '"\u2028\u2029"'
    assert canonical_json("日本語") == '"日本語"'
    assert canonical_json("\ufeff\uffff") == '"\ufeff\uffff"'


def test_emoji_outside_the_bmp_is_written_raw_as_four_utf8_bytes() -> None:
    text = canonical_json("😀")
    assert text == '"😀"'
    assert text.encode("utf-8") == b'"\xf0\x9f\x98\x80"'


def test_a_long_plain_string_is_copied_unchanged() -> None:
    body = "lorem ipsum " * 5000
    assert canonical_json(body) == f'"{body}"'


# --------------------------------------------------------------------------------- objects


def test_object_keys_are_sorted_by_code_point_at_every_level() -> None:
    value = {"b": 1, "a": {"z": 1, "y": 2}, "B": 3, "aa": 4, "é": 5, "z": 6, "": 7}
    assert canonical_json(value) == '{"":7,"B":3,"a":{"y":2,"z":1},"aa":4,"b":1,"z":6,"é":5}'


def test_a_key_above_u_ffff_sorts_after_a_key_in_u_e000_to_u_ffff() -> None:
    # UTF-16 order would put U+1F600 (surrogates D83D DE00) before U+FF01; code point order
    # (and UTF-8 byte order, serde_json's BTreeMap order) puts it after.
    value = {"\U0001f600": 1, "\uff01": 2, "\ue000": 3}
    assert canonical_json(value) == '{"\ue000":3,"\uff01":2,"\U0001f600":1}'


def test_keys_are_escaped_like_strings() -> None:
    assert canonical_json({'q"\n': 1}) == '{"q\\"\\n":1}'


def test_nested_lists_and_objects_are_compact() -> None:
    value = {"z": [1, {"b": [], "a": {}}, None], "a": [[], [[]]], "m": {"k": [True, False]}}
    assert (
        canonical_json(value)
        == '{"a":[[],[[]]],"m":{"k":[true,false]},"z":[1,{"a":{},"b":[]},null]}'
    )


def test_tuples_are_arrays() -> None:
    assert canonical_json((1, ("a", None))) == '[1,["a",null]]'
    assert canonical_json({"t": ()}) == '{"t":[]}'


def test_top_level_scalars_and_empty_containers() -> None:
    assert canonical_json(None) == "null"
    assert canonical_json(True) == "true"
    assert canonical_json(False) == "false"
    assert canonical_json("") == '""'
    assert canonical_json({}) == "{}"
    assert canonical_json([]) == "[]"


def test_subclasses_of_json_types_encode_as_their_base_value() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    class Mode(enum.StrEnum):
        FAST = "fast"

    ordered = collections.OrderedDict([("b", 1), ("a", 2)])
    defaulted: collections.defaultdict[str, int] = collections.defaultdict(int, {"x": 1})
    assert canonical_json([Colour.RED, Mode.FAST]) == '[1,"fast"]'
    assert canonical_json(ordered) == '{"a":2,"b":1}'
    assert canonical_json(defaulted) == '{"x":1}'


# -------------------------------------------------------------------------------- integers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (-1, "-1"),
        (2**63 - 1, "9223372036854775807"),
        (2**63, "9223372036854775808"),
        (2**64 - 1, "18446744073709551615"),
        (-(2**63), "-9223372036854775808"),
    ],
)
def test_integers_from_minus_2_63_to_2_64_minus_1_print_as_integers(
    value: int, expected: str
) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30, -(10**30)])
def test_integers_outside_the_64_bit_range_raise(value: int) -> None:
    with pytest.raises(ValueError, match=r"at \$\[\"n\"\]: integer"):
        canonical_json({"n": value})


def test_bools_are_true_and_false_never_one_and_zero() -> None:
    assert canonical_json([True, 1, False, 0]) == "[true,1,false,0]"
    assert canonical_json({"a": True}) == '{"a":true}'


# ------------------------------------------------------------------------------ rejections


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinities_raise_with_their_path(value: float) -> None:
    with pytest.raises(ValueError, match=r"at \$\[\"a\"\]\[1\]\[\"b\"\]: float"):
        canonical_json({"a": [0, {"b": value}]})


@pytest.mark.parametrize("key", [1, None, True, 1.5, ("t",)])
def test_non_string_keys_raise_with_the_path_of_their_object(key: Any) -> None:
    with pytest.raises(ValueError, match=r"at \$\[\"outer\"\]: object key .* is not a string"):
        canonical_json({"outer": {key: 1}})


def test_mixed_string_and_integer_keys_raise() -> None:
    with pytest.raises(ValueError, match=r"at \$: object key 2 \(int\) is not a string"):
        canonical_json({"a": 1, 2: 3})


def test_a_lone_surrogate_in_a_string_raises() -> None:
    with pytest.raises(ValueError, match=r"at \$\[0\]\[\"s\"\]: .*U\+D800"):
        canonical_json([{"s": "ok\ud800"}])


def test_a_lone_surrogate_in_a_key_raises() -> None:
    with pytest.raises(ValueError, match=r"at \$\[\"\\udc00\"\]: object key .*U\+DC00"):
        canonical_json({"\udc00": 1})


def test_a_utf16_surrogate_pair_spelled_as_two_code_points_is_not_an_emoji_and_raises() -> None:
    with pytest.raises(ValueError, match="lone surrogate"):
        canonical_json("\ud83d\ude00")


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        ({1, 2}, "set"),
        (frozenset(), "frozenset"),
        (b"x", "bytes"),
        (bytearray(b"x"), "bytearray"),
        (object(), "object"),
        (decimal.Decimal("1.5"), "decimal.Decimal"),
        (1j, "complex"),
        (uuid.UUID(SESSION), "uuid.UUID"),
    ],
)
def test_values_that_are_not_json_types_raise_with_their_path(value: Any, type_name: str) -> None:
    with pytest.raises(ValueError, match=rf"at \$\[\"x\"\]\[0\]: value of type {type_name} "):
        canonical_json({"x": [value]})


def test_a_circular_reference_raises_instead_of_recursing_forever() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match=r"at \$\[\"l\"\]\[0\]: circular reference"):
        canonical_json({"l": loop})


def test_nesting_deeper_than_the_python_stack_raises_a_value_error() -> None:
    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        canonical_json(deep)


def test_rejections_are_value_errors_not_type_errors() -> None:
    for bad in ({1: 1}, {"a": 1, 2: 3}, {1, 2}, object()):
        with pytest.raises(ValueError):
            canonical_json(bad)


# --------------------------------------------------------------------------- call_signature


def _manual_signature(session: bytes, step: int, tool: str, canonical_args: str) -> str:
    tool_bytes = tool.encode("utf-8")
    args_bytes = canonical_args.encode("utf-8")
    stream = (
        session
        + step.to_bytes(4, "little")
        + len(tool_bytes).to_bytes(4, "little")
        + tool_bytes
        + len(args_bytes).to_bytes(4, "little")
        + args_bytes
    )
    return blake3(stream).hexdigest()


def test_signature_hashes_uuid_step_tool_and_canonical_args_in_the_documented_layout() -> None:
    args = {"to": "bob@example.com", "amount": 12.5, "tags": ["x"]}
    expected = _manual_signature(
        SESSION_BYTES, 7, "send_email", '{"amount":12.5,"tags":["x"],"to":"bob@example.com"}'
    )
    assert call_signature(SESSION, 7, "send_email", args) == expected


def test_signature_lengths_count_utf8_bytes_not_characters() -> None:
    args = {"name": "Zoë 😀", "n": 1e-7}
    expected = _manual_signature(SESSION_BYTES, 0, "outil_é", '{"n":1e-7,"name":"Zoë 😀"}')
    assert call_signature(SESSION, 0, "outil_é", args) == expected


def test_signature_of_a_fixed_call_is_stable() -> None:
    # A fixed vector for the other side of the wire to reproduce.
    assert call_signature(SESSION, 1, "t", {}) == _manual_signature(SESSION_BYTES, 1, "t", "{}")
    assert call_signature(SESSION, 1, "t", {}) == (
        "b86de5e1fe8c3004a97f2da2d260921d51f0753a99345eb2055b02e8c698293c"
    )


def test_signature_is_64_lowercase_hex_characters() -> None:
    assert HEX64.fullmatch(call_signature(SESSION, 0, "tool", {"a": [1, 2.5, None]}))


@pytest.mark.parametrize(
    "spelling",
    [SESSION.upper(), SESSION.replace("-", ""), "{" + SESSION + "}", "urn:uuid:" + SESSION],
)
def test_every_textual_form_of_the_same_uuid_signs_alike(spelling: str) -> None:
    assert call_signature(spelling, 3, "t", [1]) == call_signature(SESSION, 3, "t", [1])


@pytest.mark.parametrize(
    "session_id",
    [
        "",
        "not-a-uuid",
        "6f1c2d3e-4b5a-4c6d-8e7f",
        SESSION + "0",
        "g" * 32,
        "6f1c2d3e4b5a4c6d8e7f9a0b1c2d_3e4",  # int(..., 16) would accept the underscore
        " f1c2d3e4b5a4c6d8e7f9a0b1c2d3e4f",
        "+f1c2d3e4b5a4c6d8e7f9a0b1c2d3e4f",
        "\u0661" * 32,  # ARABIC-INDIC DIGIT ONE, a digit to int() but not hex text
        "{" + SESSION,
    ],
)
def test_a_session_id_that_is_not_a_uuid_raises(session_id: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        call_signature(session_id, 0, "t", {})


def test_a_session_id_that_is_not_a_string_raises_a_value_error() -> None:
    for session_id in (123, None, b"x" * 16, ["a"]):
        with pytest.raises(ValueError, match="session_id"):
            call_signature(session_id, 0, "t", {})  # type: ignore[arg-type]


@pytest.mark.parametrize("step", [0, 1, 2**32 - 1])
def test_steps_in_the_u32_range_are_accepted(step: int) -> None:
    expected = _manual_signature(SESSION_BYTES, step, "t", "null")
    assert call_signature(SESSION, step, "t", None) == expected


@pytest.mark.parametrize("step", [-1, 2**32, 2**40])
def test_a_step_outside_the_u32_range_raises(step: int) -> None:
    with pytest.raises(ValueError, match="step_index"):
        call_signature(SESSION, step, "t", {})


@pytest.mark.parametrize("step", [True, 1.0, "1", None])
def test_a_step_that_is_not_an_integer_raises(step: Any) -> None:
    with pytest.raises(ValueError, match="step_index"):
        call_signature(SESSION, step, "t", {})


def test_a_tool_name_that_is_not_valid_text_raises() -> None:
    with pytest.raises(ValueError, match="tool_name"):
        call_signature(SESSION, 0, "bad\ud800", {})
    with pytest.raises(ValueError, match="tool_name"):
        call_signature(SESSION, 0, b"tool", {})  # type: ignore[arg-type]


def test_uncanonicalizable_args_raise_from_call_signature() -> None:
    with pytest.raises(ValueError, match=r"at \$\[\"x\"\]: float"):
        call_signature(SESSION, 0, "t", {"x": math.nan})
    with pytest.raises(ValueError, match=r"at \$\[\"x\"\]: string contains a lone surrogate"):
        call_signature(SESSION, 0, "t", {"x": "\udfff"})


def test_different_step_tool_args_or_session_give_different_signatures() -> None:
    base = call_signature(SESSION, 1, "send", {"a": 1})
    others = {
        call_signature(SESSION, 2, "send", {"a": 1}),
        call_signature(SESSION, 1, "sent", {"a": 1}),
        call_signature(SESSION, 1, "send", {"a": 2}),
        call_signature(SESSION, 1, "send", {"a": 1.0}),
        call_signature(SESSION, 1, "send", {"a": True}),
        call_signature(str(uuid.UUID(int=1)), 1, "send", {"a": 1}),
    }
    assert base not in others
    assert len(others) == 6


def test_tool_name_and_args_cannot_shift_bytes_between_them() -> None:
    # Without the length prefixes, "ab" + '"c"' and "a" + 'b"c"' could hash the same bytes.
    assert call_signature(SESSION, 0, "ab", "c") != call_signature(SESSION, 0, "a", 'b"c')


def test_key_order_of_args_does_not_change_the_signature() -> None:
    first = call_signature(SESSION, 4, "t", {"a": 1, "b": {"y": 2, "x": [1, 2]}})
    second = call_signature(SESSION, 4, "t", {"b": {"x": [1, 2], "y": 2}, "a": 1})
    assert first == second


def test_tuples_and_lists_in_args_sign_alike() -> None:
    assert call_signature(SESSION, 4, "t", {"p": (1, 2)}) == call_signature(
        SESSION, 4, "t", {"p": [1, 2]}
    )


@pytest.mark.parametrize(
    "args",
    [{}, {"b": 1, "a": [1.5, None, True]}, {"text": "héllo \u2603 \x01"}, [1, 2], "s", 3, None],
)
def test_signature_of_canonical_args_is_call_signature(args: Any) -> None:
    session = "0b9f6c1e-3a41-4b67-9d0e-6a3e5d2c1f00"
    assert signature_of_canonical(session, 7, "tool", canonical_json(args)) == call_signature(
        session, 7, "tool", args
    )


@pytest.mark.parametrize(
    ("session", "step", "tool"),
    [("not-a-uuid", 0, "t"), ("0b9f6c1e-3a41-4b67-9d0e-6a3e5d2c1f00", -1, "t"),
     ("0b9f6c1e-3a41-4b67-9d0e-6a3e5d2c1f00", True, "t"),
     ("0b9f6c1e-3a41-4b67-9d0e-6a3e5d2c1f00", 0, "\ud800")],
)  # fmt: skip
def test_signature_of_canonical_args_refuses_what_call_signature_refuses(
    session: str, step: int, tool: str
) -> None:
    with pytest.raises(ValueError) as of_canonical:
        signature_of_canonical(session, step, tool, "{}")
    with pytest.raises(ValueError) as of_args:
        call_signature(session, step, tool, {})
    assert str(of_canonical.value) == str(of_args.value)
