/** Tool tiers and compensation descriptors, as the Python SDK's `undolog_sdk.tier`. */

export const ToolTier = {
  SAFE: "safe",
  COMPENSABLE: "compensable",
  IRREVERSIBLE: "irreversible",
} as const;
export type ToolTier = (typeof ToolTier)[keyof typeof ToolTier];

const ORDER: ToolTier[] = [ToolTier.SAFE, ToolTier.COMPENSABLE, ToolTier.IRREVERSIBLE];

/** The stricter of two tiers (the one a call runs under when code and registry disagree). */
export function stricterTier(a: ToolTier, b: ToolTier): ToolTier {
  return ORDER.indexOf(a) >= ORDER.indexOf(b) ? a : b;
}

/** How to undo a COMPENSABLE call (the wire's `compensation` object). */
export interface CompensationDescriptor {
  fn_name: string;
  fn_version?: string;
  args?: Record<string, unknown>;
  max_retries?: number;
  retry_backoff_ms?: number;
  /** The compensation honours its Idempotency-Key, so a run in doubt may simply run again. */
  idempotent?: boolean;
}

/** A descriptor with the Python SDK's defaults filled in. */
export function compensationDescriptor(
  fnName: string,
  options: Omit<CompensationDescriptor, "fn_name"> = {},
): Required<CompensationDescriptor> {
  if (!fnName) throw new Error("a compensation needs a name");
  return {
    fn_name: fnName,
    fn_version: options.fn_version ?? "1.0.0",
    args: options.args ?? {},
    max_retries: options.max_retries ?? 3,
    retry_backoff_ms: options.retry_backoff_ms ?? 1000,
    idempotent: options.idempotent ?? false,
  };
}
