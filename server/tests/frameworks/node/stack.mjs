// The framework tests' running stack for Node: one reprise-sim upstream (OpenAI's API and Anthropic's Messages API)
// and one reprise gateway with the embedding model (so paraphrases can hit), as real processes, plus what the tests
// ask of it: a fresh tenant per test, the store's counts, and a fetch that records each response's x-reprise-cache
// for clients that keep the response.
//
// Env: REPRISE_BIN_DIR (default target/debug), REPRISE_MODELS_DIR (default models/). Without the model, semantic
// tests skip, unless CI is set: then the stack refuses to start.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, waitReady } from "../../processes.mjs";

const root = join(import.meta.dirname, "../../../..");
const binDir = process.env.REPRISE_BIN_DIR ?? join(root, "target/debug");
const ADMIN_TOKEN = "frameworks-admin";

/** The provisioned model folder, or null when it is missing (a failure under CI). */
function modelsDir() {
  const dir = process.env.REPRISE_MODELS_DIR ?? join(root, "models");
  if (existsSync(join(dir, "all-MiniLM-L6-v2/model.onnx"))) return dir;
  if (process.env.CI) {
    throw new Error(`the embedding model is missing from ${dir} and CI is set: run scripts/provision-models.sh`);
  }
  return null;
}

export async function startStack() {
  const models = modelsDir();
  const procs = [];
  const dataDir = mkdtempSync(join(tmpdir(), "reprise-frameworks-node-"));
  const stop = async () => {
    procs.forEach((p) => p.kill("SIGTERM"));
    await Promise.all(procs.map((p) => (p.exitCode !== null ? null : new Promise((r) => p.once("exit", r)))));
    rmSync(dataDir, { recursive: true, force: true });
  };
  try {
    return await start(models, procs, dataDir, stop);
  } catch (err) {
    await stop();
    throw err;
  }
}

async function start(models, procs, dataDir, stop) {
  const simPort = await freePort();
  const simArgs = ["--listen", `127.0.0.1:${simPort}`, "--ttft-ms", "20", "--itl-ms", "1", "--tokens", "12"];
  procs.push(spawn(join(binDir, "reprise-sim"), simArgs, { stdio: "ignore" }));
  await waitReady(`http://127.0.0.1:${simPort}/healthz`);
  const gwPort = await freePort();
  const matching = models
    ? ["--model-dir", join(models, "all-MiniLM-L6-v2"), "--ort-lib", join(models, "onnxruntime/libonnxruntime.so")]
    : ["--semantic", "false"];
  procs.push(spawn(join(binDir, "reprise"), [
    "serve", "--listen", `127.0.0.1:${gwPort}`, "--upstream-url", `http://127.0.0.1:${simPort}/v1`,
    "--anthropic-upstream-url", `http://127.0.0.1:${simPort}/v1`,
    "--data-dir", dataDir, "--admin-token", ADMIN_TOKEN,
    // A slow, shared CI machine must not turn a paraphrase into an exact-only lookup.
    "--embed-deadline-ms", "5000", "--embed-queue-budget-ms", "1000", ...matching,
  ], { stdio: ["ignore", "ignore", "inherit"] }));
  const url = `http://127.0.0.1:${gwPort}`;
  await waitReady(`${url}/healthz`, 1200);
  let keys = 0;

  const stack = {
    url,
    baseURL: `${url}/v1`,
    semantic: Boolean(models),
    /** An API key no other test uses: its own tenant, so its first request is a miss. */
    key: (label) => `sk-fw-node-${label}-${++keys}`,
    health: async () => (await fetch(`${url}/healthz`)).json(),
    stored: async () => (await stack.health()).entries,
    /**
     * Waits until the store holds more than `before` entries, each with its vector when semantic matching is on:
     * entries are written off the request path, and a retried request that missed would store itself instead.
     */
    async waitStored(before, ms = 20_000) {
      const deadline = Date.now() + ms;
      while (Date.now() < deadline) {
        const h = await stack.health();
        const indexed = !stack.semantic || (h.semantic.vectors >= h.entries && h.semantic.backfill_pending === 0);
        if (h.entries > before && indexed) return;
        await new Promise((r) => setTimeout(r, 20));
      }
      throw new Error(`no new entry stored (and indexed) within ${ms} ms: ${JSON.stringify(await stack.health())}`);
    },
    /** The gateway's newest request records in /admin/requests, newest first. */
    async requests(limit = 50) {
      const headers = { authorization: `Bearer ${ADMIN_TOKEN}` };
      return (await (await fetch(`${url}/admin/requests?limit=${limit}`, { headers })).json()).data;
    },
    /** The gateway's record of a request in /admin/requests, by x-reprise-request-id (lands after the last byte). */
    async record(requestId, ms = 10_000) {
      const deadline = Date.now() + ms;
      while (Date.now() < deadline) {
        const found = (await stack.requests()).find((r) => r.id === requestId);
        if (found) return found;
        await new Promise((r) => setTimeout(r, 20));
      }
      throw new Error(`${requestId} is not in /admin/requests after ${ms} ms`);
    },
    stop,
  };
  if (models) assert.equal((await stack.health()).mode, "semantic", "the model did not load");
  return stack;
}

/** What a test needs from a response's headers: the cache outcome and the id of the gateway's record. */
export const outcomeOf = (headers) => ({
  outcome: headers.get("x-reprise-cache"),
  requestId: headers.get("x-reprise-request-id"),
});

/**
 * A `fetch` for `new OpenAI({ fetch })` that records the headers of every response: the way to read x-reprise-cache
 * when a helper such as `chat.completions.stream()` keeps the HTTP response to itself.
 */
export function recordingFetch() {
  const seen = [];
  const record = async (input, init) => {
    const response = await fetch(input, init);
    seen.push(response.headers);
    return response;
  };
  /** The headers of the only response since the last call; throws unless there was exactly one request. */
  record.one = () => {
    const got = seen.splice(0);
    assert.equal(got.length, 1, `expected one request to the gateway, saw ${JSON.stringify(got)}`);
    return got[0];
  };
  return record;
}
