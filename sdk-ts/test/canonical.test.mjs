// Canonical JSON: what the corpus cannot say (JavaScript-only values and the errors' words).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  asFloat, callSignature, canonicalJson, CanonicalJsonError, compareCodePoints,
} from "../dist/index.js";

const SESSION = "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f";

test("a whole number signs as an integer, asFloat(x) as a float", () => {
  assert.equal(canonicalJson({ a: 1 }), '{"a":1}');
  assert.equal(canonicalJson({ a: asFloat(1) }), '{"a":1.0}');
  assert.equal(canonicalJson(asFloat(-0)), "-0.0");
  assert.equal(canonicalJson(-0), "0");
  assert.equal(canonicalJson(1e-7), "1e-7");
  assert.equal(canonicalJson(0.00001), "0.00001");
  assert.equal(canonicalJson(asFloat(1e16)), "1e+16");
});

test("a whole number beyond 2**53 is refused unless it is a bigint or asFloat", () => {
  assert.throws(() => canonicalJson({ big: 2 ** 60 }), (e) =>
    e instanceof CanonicalJsonError && e.path === "$[\"big\"]" && /bigint/.test(e.message));
  assert.equal(canonicalJson({ big: 2n ** 60n }), '{"big":1152921504606846976}');
  assert.equal(canonicalJson({ big: asFloat(2 ** 60) }), '{"big":1.152921504606847e+18}');
  assert.throws(() => canonicalJson(2n ** 64n), /outside/);
});

test("values JSON cannot hold are refused with their path", () => {
  assert.throws(() => canonicalJson({ a: [1, undefined] }), /\$\["a"\]\[1\]: value of type undefined/);
  assert.throws(() => canonicalJson({ f: () => 1 }), /type function/);
  assert.throws(() => canonicalJson({ d: new Date(0) }), /type Date is not JSON/);
  assert.throws(() => canonicalJson({ n: NaN }), /float NaN has no JSON form/);
  assert.throws(() => canonicalJson("\ud800"), /lone surrogate U\+D800/);
  const loop = { a: [] };
  loop.a.push(loop);
  assert.throws(() => canonicalJson(loop), /circular reference/);
});

test("keys sort by code point: an astral key after U+FFFF", () => {
  assert.ok(compareCodePoints("\u{10000}", "\uffff") > 0);
  assert.ok(compareCodePoints("\uffff", "\u{10000}") < 0);
  assert.equal(canonicalJson({ "\u{10000}": 1, "\uffff": 2, "\ue000": 3 }),
    '{"\ue000":3,"\uffff":2,"\u{10000}":1}');
});

test("the call's head is checked as in Python", () => {
  assert.throws(() => callSignature("not-a-uuid", 1, "t", {}), /session_id must be a UUID/);
  assert.throws(() => callSignature(SESSION, -1, "t", {}), /step_index must be in/);
  assert.throws(() => callSignature(SESSION, 2 ** 32, "t", {}), /step_index must be in/);
  assert.throws(() => callSignature(SESSION, 1.5, "t", {}), /step_index must be an integer/);
  assert.throws(() => callSignature(SESSION, 1, "\udc00", {}), /lone surrogate/);
  assert.match(callSignature(SESSION, 1, "t", {}), /^[0-9a-f]{64}$/);
});
