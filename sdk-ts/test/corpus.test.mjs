// The signature corpus (test/gen_corpus.py): canonical JSON and call signatures byte for byte
// what the Python SDK computes, and refused wherever Python refuses.
import assert from "node:assert/strict";
import { readFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { asFloat, callSignature, canonicalJson, UndoLogSession } from "../dist/index.js";
import { repoRoot, runPython } from "./helpers.mjs";

function build(node) {
  if ("n" in node) return null;
  if ("b" in node) return node.b;
  if ("s" in node) return node.s;
  if ("i" in node) {
    const big = BigInt(node.i);
    const n = Number(big);
    return Number.isSafeInteger(n) ? n : big;
  }
  if ("f" in node) {
    const text = node.f;
    const value = text === "nan" ? NaN : text === "inf" ? Infinity : text === "-inf" ? -Infinity : Number(text);
    return Number.isInteger(value) ? asFloat(value) : value; // -0.0 and 1.0 stay floats
  }
  if ("l" in node) return node.l.map(build);
  const out = {};
  for (const [key, value] of node.d) out[key] = build(value);
  return out;
}

const count = Number(process.env.UNDOLOG_CORPUS_COUNT ?? 10_000);
const path = join(mkdtempSync(join(tmpdir(), "undolog-corpus-")), "corpus.json");
runPython([join(repoRoot, "sdk-ts", "test", "gen_corpus.py"), path, "--count", String(count)]);
const { cases, steps } = JSON.parse(readFileSync(path, "utf-8"));

test(`the corpus has at least ${count} cases, some of them refused`, () => {
  assert.ok(cases.length >= count);
  assert.ok(cases.some((c) => c.error));
  assert.ok(cases.filter((c) => !c.error).length > count * 0.8);
});

test("every case signs byte for byte as in Python, or is refused as in Python", () => {
  const wrong = [];
  for (const [index, c] of cases.entries()) {
    const args = build(c.args);
    if (c.error) {
      assert.throws(() => canonicalJson(args), /cannot canonicalize/, `case ${index} must be refused`);
      assert.throws(() => callSignature(c.session, c.step, c.tool, args));
      continue;
    }
    const text = canonicalJson(args);
    const signature = callSignature(c.session, c.step, c.tool, args);
    if (text !== c.canonical || signature !== c.signature) {
      wrong.push({ index, expected: c.canonical, got: text });
      if (wrong.length > 5) break;
    }
  }
  assert.deepEqual(wrong, []);
});

test("steps from tool-call ids are Python's", () => {
  const session = new UndoLogSession();
  assert.ok(steps.length > 100);
  for (const [callId, step] of steps) assert.equal(session.stepForCall(callId), step, callId);
});
