// Test helpers: the repository's Python (the venv the README's commands make), a free port,
// and a real `undolog serve` (SQLite in a temp dir) in front of the demo tool server.
import { spawn, execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

export function python() {
  if (process.env.UNDOLOG_PYTHON) return process.env.UNDOLOG_PYTHON;
  const venv = join(repoRoot, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

export function pythonEnv(extra = {}) {
  const path = [join(repoRoot, "src"), join(repoRoot, "sdk", "src")];
  if (process.env.PYTHONPATH) path.push(process.env.PYTHONPATH);
  return { ...process.env, PYTHONPATH: path.join(":"), ...extra };
}

export function runPython(args) {
  return execFileSync(python(), args, { env: pythonEnv(), encoding: "utf-8", stdio: ["ignore", "pipe", "pipe"] });
}

export async function freePort() {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolvePort(port));
    });
    server.on("error", reject);
  });
}

async function answers(url) {
  try {
    const response = await fetch(url, { signal: AbortSignal.timeout(2000) });
    return response.status === 200;
  } catch {
    return false;
  }
}

async function waitUntil(check, what, timeoutMs = 90_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

function start(args, env, port, children) {
  const child = spawn(python(), ["-m", "undolog", ...args], {
    env: pythonEnv(env),
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (chunk) => {
    stderr = (stderr + chunk).slice(-4000);
  });
  children.push(child);
  return waitUntil(
    async () => {
      if (child.exitCode !== null) throw new Error(`${args[0]} exited ${child.exitCode}: ${stderr}`);
      return answers(`http://127.0.0.1:${port}/health`);
    },
    `${args[0]} on ${port}`,
  ).then(() => child);
}

const sha256 = (text) => createHash("sha256").update(text, "utf-8").digest("hex");

/**
 * A proxy of its own: one org with an admin, an agent and an approver key, the demo tools
 * upstream, short approval waits. `stop()` kills both processes and removes the temp dir.
 */
export async function startProxy({ env = {} } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "undolog-ts-"));
  const keys = {
    admin: "ul_ts_admin_" + randomBytes(12).toString("hex"),
    agent: "ul_ts_agent_" + randomBytes(12).toString("hex"),
    approver: "ul_ts_approver_" + randomBytes(12).toString("hex"),
  };
  const org = "org-ts-" + randomBytes(4).toString("hex");
  const toml = [`[[orgs]]`, `id = "${org}"`]
    .concat(
      Object.entries(keys).flatMap(([role, key]) => [
        `[[orgs.keys]]`, `name = "${role}"`, `role = "${role}"`, `sha256 = "${sha256(key)}"`,
      ]),
    )
    .join("\n");
  writeFileSync(join(dir, "undolog.toml"), toml + "\n");
  const children = [];
  const upstreamPort = await freePort();
  const port = await freePort();
  const stop = () => {
    for (const child of children) child.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await start(["demo-tools", "--port", String(upstreamPort)], {}, upstreamPort, children);
    const serveEnv = {
      UNDOLOG_DATABASE_URL: `sqlite:///${join(dir, "undolog.db")}`,
      UNDOLOG_UPSTREAM_URL: `http://127.0.0.1:${upstreamPort}`,
      UNDOLOG_CONFIG: join(dir, "undolog.toml"),
      UNDOLOG_PORT: String(port),
      UNDOLOG_HOST: "127.0.0.1",
      UNDOLOG_SPOOL_DIR: join(dir, "spool"),
      UNDOLOG_LOG_LEVEL: "warning",
      UNDOLOG_WORKERS: "1",
      ...env,
    };
    await start(["serve"], serveEnv, port, children);
  } catch (error) {
    stop();
    throw error;
  }
  return { url: `http://127.0.0.1:${port}`, upstream: `http://127.0.0.1:${upstreamPort}`, keys, org, stop };
}
