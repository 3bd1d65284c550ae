"""The signature corpus: cases whose canonical JSON and call signature the Python SDK computes,
for the TypeScript SDK's tests to check byte for byte (sdk-ts/test/corpus.test.mjs).

    python sdk-ts/test/gen_corpus.py OUT.json [--count N] [--seed S]

Each case carries the call (session, step, tool) and its arguments as a *typed tree*, so that
the TypeScript side builds the value a TypeScript caller would pass for the same Python value:
`{"i": "123"}` an integer (a number when exact in a double, else a bigint), `{"f": "1.5"}` a
float (Python's repr; a whole one becomes `asFloat(x)`), `{"s": ...}` a string (lone
surrogates kept as JSON escapes), `{"b": true}`, `{"n": null}`, `{"l": [...]}` an array,
`{"d": [[key, value], ...]}` an object. `steps` pairs tool-call ids with the step
`UndoLogSession.step_for_call` gives them. The expected answer is the canonical text and the
signature, or `"error"` where Python refuses the value (and TypeScript must refuse it too).
The fixed cases come first (notation boundaries, escapes, key order, integer limits), then
random ones from the seed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import struct
import sys
import uuid
from typing import Any

from undolog_sdk import UndoLogSession, call_signature, canonical_json

INTERESTING = [
    "a", "Z", "0", " ", '"', "\\", "/", "\b", "\t", "\n", "\f", "\r", "\x00", "\x01", "\x1f",
    "\x7f", "\x80", "é", "ß", "\u0301", "\u2028", "\u2029", "\ud7ff", "\ue000", "\uffff", "\ufeff",
    "中", "😀", "\U0001f600", "\U00010000", "\U0010ffff", "𝄞",
]  # fmt: skip
LONE = ["\ud800", "\udbff", "\udc00", "\udfff"]

FIXED_FLOATS = [
    0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 1.5, 100.0, 1e15, 1e16, 1e17, 1e-5, 1e-6, 1.5e-7, 0.00001,
    0.000123, 123456789012345.6, 1234567890123456.7, 9007199254740992.0, 9007199254740993.0,
    1e20, 1e21, 1e22, 1e100, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
    9.999999999999999e14, 1e15 - 0.5, 9.999999999999999e-6, 0.30000000000000004, 2.5e-5, 3.0e-5,
    -2.5e-324, 4.9e-324, 1.2345e-10, 6.02214076e23,
]  # fmt: skip
FIXED_INTS = [
    0, 1, -1, 42, 2**31, 2**32 - 1, 2**32, 2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1,
    -(2**63), 2**64 - 1, 2**63,
]  # fmt: skip
BAD = [2**64, -(2**63) - 1, 10**30, math.nan, math.inf, -math.inf]


def typed(value: Any) -> Any:
    if value is None:
        return {"n": None}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": str(value)}
    if isinstance(value, float):
        return {"f": repr(value)}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, list):
        return {"l": [typed(v) for v in value]}
    if isinstance(value, dict):
        return {"d": [[k, typed(v)] for k, v in value.items()]}
    raise TypeError(type(value))


def random_float(rng: random.Random) -> float:
    choice = rng.random()
    if choice < 0.4:
        while True:
            (value,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
            if math.isfinite(value):
                return float(value)
    if choice < 0.7:
        return rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-25, 25)
    if choice < 0.85:
        return float(rng.randint(-(10**6), 10**6)) * 10 ** rng.randint(0, 20)  # whole floats
    return rng.choice(FIXED_FLOATS) * rng.choice([1, -1])


def random_text(rng: random.Random, lone: bool) -> str:
    parts = [rng.choice(INTERESTING) if rng.random() < 0.6 else chr(rng.randint(0x20, 0x7E))
             for _ in range(rng.randint(0, 8))]  # fmt: skip
    if lone:
        parts.insert(rng.randint(0, len(parts)), rng.choice(LONE))
    return "".join(parts)


def random_value(rng: random.Random, depth: int, bad: bool) -> Any:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        if rng.random() < 0.3:
            return rng.choice(FIXED_INTS) * rng.choice([1, -1])
        return rng.randint(-(2**63), 2**64 - 1) >> rng.randint(0, 63)
    if kind == "float":
        return random_float(rng)
    if kind == "str":
        return random_text(rng, lone=bad and rng.random() < 0.05)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_value(rng, depth + 1, bad) for _ in range(rng.randint(0, 4))]
    return {random_text(rng, lone=bad and rng.random() < 0.02): random_value(rng, depth + 1, bad)
            for _ in range(rng.randint(0, 5))}  # fmt: skip


def case(session: str, step: int, tool: str, args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"session": session, "step": step, "tool": tool, "args": typed(args)}
    try:
        out["canonical"] = canonical_json(args)
        out["signature"] = call_signature(session, step, tool, args)
    except ValueError:
        out["error"] = True
    return out


def fixed_cases() -> list[dict[str, Any]]:
    session = "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f"
    values: list[Any] = [
        {}, [], "", 0, None, True, False, {"a": {}}, [[[]]], {"b": 1, "a": 2, "A": 3, "": 4},
        {"\uffff": 1, "\U00010000": 2, "\ue000": 3, "z": 4}, {"é": 1, "e": 2, "f": 3},
        {"text": "line\nbreak\ttab\"quote\\slash/"}, {"ctl": "".join(chr(c) for c in range(32))},
        {"nested": {"z": [1, 2.5, {"y": None, "x": True}], "a": "😀"}},
    ]  # fmt: skip
    values += [{"x": f} for f in FIXED_FLOATS] + [{"x": -f} for f in FIXED_FLOATS]
    values += [{"x": i} for i in FIXED_INTS] + [{"x": -i} for i in FIXED_INTS]
    values += [{"x": b} for b in BAD] + [{"x": s} for s in LONE] + [{s: 1} for s in LONE]
    cases = [case(session, 1, "echo", v) for v in values]
    steps = [0, 1, 2**31, 2**32 - 1]
    tools = ["echo", "send_email", "é", "😀tool", ""]
    cases += [case(session, s, t, {"k": "v"}) for s in steps for t in tools]
    for form in (session.upper(), session.replace("-", ""), "{" + session + "}",
                 "urn:uuid:" + session):  # fmt: skip
        cases.append(case(form, 7, "echo", {"same": "call"}))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261205)
    options = parser.parse_args()
    rng = random.Random(options.seed)
    cases = fixed_cases()
    while len(cases) < options.count:
        bad = rng.random() < 0.05
        args = {random_text(rng, lone=False): random_value(rng, 1, bad)
                for _ in range(rng.randint(0, 4))}  # fmt: skip
        session = str(uuid.UUID(int=rng.getrandbits(128)))
        step = rng.choice([rng.randint(0, 100), rng.randint(0, 2**32 - 1)])
        tool = random_text(rng, lone=False) or "t"
        cases.append(case(session, step, tool, args))
    # Steps from a framework's tool-call ids (`step_for_call`), the same in both SDKs.
    session = UndoLogSession(org_id="corpus")
    ids = ["call_abc123", "toolu_01A09q90qw90lq917835lq9", "é", "😀", "x" * 300]
    ids += [random_text(rng, lone=False) or "id" for _ in range(200)]
    steps = [[call_id, session.step_for_call(call_id)] for call_id in ids]
    with open(options.out, "w", encoding="utf-8") as f:
        json.dump({"seed": options.seed, "cases": cases, "steps": steps}, f, ensure_ascii=True)
    errors = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} cases ({errors} refused) -> {options.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
