/**
 * Canonical JSON and the call signature, byte for byte what the Python SDK and the proxy compute.
 *
 * Canonical JSON is compact, object keys sorted by Unicode code point at every level, strings
 * escaped only where JSON requires it (`"`, `\` and U+0000..U+001F; \b \t \n \f \r short, the
 * rest as lowercase \u00xx), integers as written, and floats printed the way serde_json prints
 * an f64: the shortest digits that read back as the same double, in plain notation when the
 * decimal exponent E of the first digit is in [-5, 15] (a whole number keeps ".0"), otherwise
 * `d.ddde+E` / `d.ddde-E`; zero is "0.0" and negative zero "-0.0".
 *
 * JavaScript has one number type, so a number that is a whole number signs as an integer
 * (`1` -> "1"), as the same value parsed from JSON text does in Python. A whole float that
 * Python would sign as a float (`1.0` -> "1.0") is written `asFloat(1)`. Integers are exact
 * only up to 2**53: a whole number beyond `Number.MAX_SAFE_INTEGER` is refused (it may not be
 * the integer the caller meant); pass a `bigint` for a larger integer, or `asFloat(x)` for a
 * float. Integers must lie in [-2**63, 2**64 - 1], as in Python.
 *
 * Refused, with a `CanonicalJsonError` naming the path (`$["key"][0]`): NaN and infinities,
 * lone surrogates in strings or keys, `undefined`, functions, symbols, class instances other
 * than arrays and plain objects, circular references.
 */
import { blake3 } from "@noble/hashes/blake3.js";

const INT_MIN = -(2n ** 63n);
const INT_MAX = 2n ** 64n - 1n;
const U32_MAX = 2 ** 32 - 1;

/** A number to sign as a float even when it is a whole number (`asFloat(1)` -> "1.0"). */
export class Float64 {
  readonly value: number;
  constructor(value: number) {
    if (typeof value !== "number") {
      throw new TypeError(`asFloat needs a number, got ${typeof value}`);
    }
    this.value = value;
  }
  toJSON(): number {
    return this.value;
  }
}

/** Mark `value` as a float for canonical JSON (see the module's comment). */
export function asFloat(value: number): Float64 {
  return new Float64(value);
}

/** A value canonical JSON cannot hold; the message names where it sits. */
export class CanonicalJsonError extends Error {
  readonly path: string;
  constructor(path: string, reason: string) {
    super(`cannot canonicalize value at ${path}: ${reason}`);
    this.name = "CanonicalJsonError";
    this.path = path;
  }
}

/** serde_json's layout of a finite double (the digits are the shortest that round-trip). */
export function formatFloat(value: number, path = "$"): string {
  if (!Number.isFinite(value)) {
    throw new CanonicalJsonError(path, `float ${value} has no JSON form`);
  }
  if (value === 0) {
    return Object.is(value, -0) ? "-0.0" : "0.0";
  }
  // toExponential() with no argument gives the shortest digits that read back as `value`.
  const [mantissa, exponentText] = value.toExponential().split("e");
  const sign = mantissa.startsWith("-") ? "-" : "";
  const digits = mantissa.replace("-", "").replace(".", "");
  const exponent = Number(exponentText);
  if (exponent >= -5 && exponent <= 15) {
    if (exponent < 0) {
      return `${sign}0.${"0".repeat(-exponent - 1)}${digits}`;
    }
    if (digits.length <= exponent + 1) {
      return `${sign}${digits}${"0".repeat(exponent + 1 - digits.length)}.0`;
    }
    return `${sign}${digits.slice(0, exponent + 1)}.${digits.slice(exponent + 1)}`;
  }
  const fraction = digits.length > 1 ? `.${digits.slice(1)}` : "";
  return `${sign}${digits[0]}${fraction}e${exponent < 0 ? "-" : "+"}${Math.abs(exponent)}`;
}

function loneSurrogate(text: string): number | null {
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        i++;
        continue;
      }
      return unit;
    }
    if (unit >= 0xdc00 && unit <= 0xdfff) {
      return unit;
    }
  }
  return null;
}

function hex4(unit: number): string {
  return unit.toString(16).toUpperCase().padStart(4, "0");
}

function encodeString(text: string, path: string, what: string): string {
  const lone = loneSurrogate(text);
  if (lone !== null) {
    throw new CanonicalJsonError(
      path,
      `${what} contains a lone surrogate U+${hex4(lone)}, which cannot be encoded as UTF-8`,
    );
  }
  // For well-formed strings JSON.stringify escapes exactly serde_json's set, the same way.
  return JSON.stringify(text);
}

/** Order of two strings by Unicode code point (UTF-16 order differs above U+FFFF). */
export function compareCodePoints(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    // A surrogate stands for a code point above U+FFFF: after every other unit, although
    // U+E000..U+FFFF are larger units. Two surrogates, or two other units, compare as units.
    const xs = x >= 0xd800 && x <= 0xdfff;
    const ys = y >= 0xd800 && y <= 0xdfff;
    if (xs !== ys) return xs ? 1 : -1;
    return x - y;
  }
  return a.length - b.length;
}

function keyPath(path: string, key: string): string {
  return `${path}[${JSON.stringify(key).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}]`;
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "object") {
    const name = (value as object).constructor?.name;
    return name ? name : "object";
  }
  return typeof value;
}

function encode(value: unknown, path: string, onPath: Set<object>): string {
  switch (typeof value) {
    case "string":
      return encodeString(value, path, "string");
    case "boolean":
      return value ? "true" : "false";
    case "bigint":
      if (value < INT_MIN || value > INT_MAX) {
        throw new CanonicalJsonError(path, `integer ${value} is outside [-2**63, 2**64 - 1]`);
      }
      return value.toString();
    case "number":
      if (!Number.isFinite(value)) {
        throw new CanonicalJsonError(path, `float ${value} has no JSON form`);
      }
      if (Number.isInteger(value)) {
        if (!Number.isSafeInteger(value)) {
          throw new CanonicalJsonError(
            path,
            `the number ${value} is a whole number beyond 2**53, which JavaScript does not hold ` +
              "exactly: pass a bigint for an integer, or asFloat(x) for a float",
          );
        }
        return Object.is(value, -0) ? "0" : String(value);
      }
      return formatFloat(value, path);
    case "object": {
      if (value === null) return "null";
      if (value instanceof Float64) return formatFloat(value.value, path);
      if (onPath.has(value)) {
        throw new CanonicalJsonError(path, "circular reference (a container holds itself)");
      }
      if (Array.isArray(value)) {
        onPath.add(value);
        const parts = value.map((item, index) => encode(item, `${path}[${index}]`, onPath));
        onPath.delete(value);
        return `[${parts.join(",")}]`;
      }
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) {
        throw new CanonicalJsonError(
          path,
          `value of type ${describe(value)} is not JSON (use a plain object, an array, a ` +
            "string, a number, a bigint, a boolean or null)",
        );
      }
      onPath.add(value);
      const keys = Object.keys(value);
      for (const key of keys) {
        encodeString(key, keyPath(path, key), "object key");
      }
      keys.sort(compareCodePoints);
      const record = value as Record<string, unknown>;
      const parts = keys.map(
        (key) => `${JSON.stringify(key)}:${encode(record[key], keyPath(path, key), onPath)}`,
      );
      onPath.delete(value);
      return `{${parts.join(",")}}`;
    }
    default:
      throw new CanonicalJsonError(
        path,
        `value of type ${typeof value} is not JSON (use a plain object, an array, a string, ` +
          "a number, a bigint, a boolean or null)",
      );
  }
}

/** `value` as canonical JSON (see the module's comment). Throws `CanonicalJsonError`. */
export function canonicalJson(value: unknown): string {
  return encode(value, "$", new Set());
}

const UUID_TEXT =
  /^(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{32}|\{[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\}|urn:uuid:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$/;

function sessionBytes(sessionId: string): Uint8Array {
  if (typeof sessionId !== "string" || !UUID_TEXT.test(sessionId)) {
    throw new Error(`session_id must be a UUID string, got ${JSON.stringify(sessionId)}`);
  }
  const hex = sessionId.replace(/^urn:uuid:/, "").replace(/[{}-]/g, "");
  const bytes = new Uint8Array(16);
  for (let i = 0; i < 16; i++) {
    bytes[i] = Number.parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  }
  return bytes;
}

const utf8 = new TextEncoder();

function u32le(value: number): Uint8Array {
  const out = new Uint8Array(4);
  new DataView(out.buffer).setUint32(0, value, true);
  return out;
}

/**
 * The BLAKE3-256 signature of a call whose args are already canonical JSON, as 64 lowercase
 * hex characters: `[session UUID, 16 bytes][step, u32 LE][len(tool), u32 LE][tool, UTF-8]`
 * `[len(args), u32 LE][args, UTF-8]`.
 */
export function signatureOfCanonical(
  sessionId: string,
  stepIndex: number,
  toolName: string,
  argsJson: string,
): string {
  const session = sessionBytes(sessionId);
  if (typeof stepIndex !== "number" || !Number.isInteger(stepIndex)) {
    throw new Error(`step_index must be an integer, got ${describe(stepIndex)}`);
  }
  if (stepIndex < 0 || stepIndex > U32_MAX) {
    throw new Error(`step_index must be in [0, 2**32 - 1], got ${stepIndex}`);
  }
  if (typeof toolName !== "string") {
    throw new Error(`tool_name must be a string, got ${describe(toolName)}`);
  }
  if (loneSurrogate(toolName) !== null) {
    throw new Error(
      `tool_name ${JSON.stringify(toolName)} contains a lone surrogate and cannot be encoded as UTF-8`,
    );
  }
  const tool = utf8.encode(toolName);
  const payload = utf8.encode(argsJson);
  const parts = [session, u32le(stepIndex), u32le(tool.length), tool, u32le(payload.length), payload];
  const buffer = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const part of parts) {
    buffer.set(part, offset);
    offset += part.length;
  }
  return Buffer.from(blake3(buffer)).toString("hex");
}

/** The call signature of one tool call (see `signatureOfCanonical`). */
export function callSignature(
  sessionId: string,
  stepIndex: number,
  toolName: string,
  args: unknown,
): string {
  sessionBytes(sessionId); // the same order of checks as Python: session, step, tool, args
  return signatureOfCanonical(sessionId, stepIndex, toolName, canonicalJson(args));
}

/** BLAKE3 of bytes, for the keyed step of a framework's tool-call id. */
export function blake3Bytes(data: Uint8Array, length = 32): Uint8Array {
  return blake3(data, { dkLen: length });
}
