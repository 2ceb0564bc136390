// Claude Code (`@anthropic-ai/claude-code`, pinned in package.json) run non-interactively, `claude -p`, with
// ANTHROPIC_BASE_URL at a real gateway in front of reprise-sim: the same prompt asked twice, from the same project
// folder, is a miss the first time and a hit the second, with the same answer; a paraphrase asked on a later run is a
// semantic hit; another question is a miss.
//
// What it sends (recorded from this version against reprise-sim: server/tests/fixtures/claude-code/): per run,
// `POST /v1/messages?beta=true`, streamed, with a large system prompt and tool list, `cache_control` markers,
// `thinking`, `context_management`, `output_config` and an `anthropic-beta` list that includes `per-turn-control`
// (its environment comes as a `system` turn after the question, which the sim accepts under that beta, as Anthropic
// does); the question is the last text block of one user message after <system-reminder> blocks (working folder,
// date, tools and skills). What changes per run: the `X-Claude-Code-Session-Id` header, `metadata.user_id` (with the
// session id) and the first `system` block, `x-anthropic-billing-header: cc_version=<version>.<3 hex digits>; ...`,
// whose suffix changes with the prompt. The gateway keys none of them, and keys the reminders as context, so the
// typed question alone is the text it compares.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startStack } from "../node/stack.mjs";

const CLAUDE = join(import.meta.dirname, "node_modules/.bin/claude");
const QUESTION = "how do I reset my password";
const PARAPHRASE = "I forgot my password, how can I reset it";

let stack;
let home;
let project;
before(async () => {
  stack = await startStack();
  home = mkdtempSync(join(tmpdir(), "reprise-claude-home-"));
  project = mkdtempSync(join(tmpdir(), "reprise-claude-project-"));
});
after(async () => {
  await stack?.stop();
  for (const dir of [home, project]) if (dir) rmSync(dir, { recursive: true, force: true });
});

/** One `claude -p <prompt> --output-format json` run against the gateway: its parsed result. */
function claude(apiKey, prompt) {
  // Only what Claude Code needs: no user settings, no telemetry, no update checks, no side requests.
  const env = {
    PATH: process.env.PATH,
    HOME: home,
    ANTHROPIC_BASE_URL: stack.url,
    ANTHROPIC_API_KEY: apiKey,
    DISABLE_TELEMETRY: "1",
    DISABLE_AUTOUPDATER: "1",
    DISABLE_NON_ESSENTIAL_MODEL_CALLS: "1",
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1",
  };
  const args = ["-p", prompt, "--output-format", "json"];
  const child = spawn(CLAUDE, args, { cwd: project, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (err += d));
  const timer = setTimeout(() => child.kill("SIGKILL"), 120_000);
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      if (code !== 0) return reject(new Error(`claude exited with ${code}: ${err}${out}`));
      resolve(JSON.parse(out));
    });
  });
}

/** The gateway's records of the Messages requests since `seen` (ids before the run), oldest first. */
async function messagesSince(seen) {
  return (await stack.requests()).filter((r) => !seen.has(r.id) && r.route === "messages").reverse();
}

/** One run of `question` through the gateway: the record of the request that answered it, and its result. */
async function run(key, question) {
  const seen = new Set((await stack.requests()).map((r) => r.id));
  const result = await claude(key, question);
  assert.equal(result.is_error, false, JSON.stringify(result));
  // The run's last request is the one that answered; any before it were refused and never stored.
  const records = await messagesSince(seen);
  const answered = records.at(-1);
  assert.ok(answered, "claude sent no Messages request to the gateway");
  for (const refused of records.slice(0, -1)) assert.equal(refused.status, 400, JSON.stringify(records));
  return { answered, records, result };
}

test("claude -p: the same prompt asked twice is a hit, a paraphrase a semantic hit", async () => {
  const key = stack.key("claude-code");
  const answers = [];
  const steps = [[QUESTION, "miss"], [QUESTION, "hit"]];
  if (stack.semantic) steps.push([PARAPHRASE, "semantic-hit"]);
  for (const [question, expected] of steps) {
    const before = await stack.stored();
    const { answered, records, result } = await run(key, question);
    assert.deepEqual([answered.status, answered.stream, answered.cache], [200, true, expected], JSON.stringify(records));
    if (expected === "miss") await stack.waitStored(before);
    answers.push(result.result);
  }
  assert.ok(answers[0]);
  for (const answer of answers.slice(1)) assert.equal(answer, answers[0], "a hit answers with the stored text");
});

test("claude -p: another question in the same project is a miss", async () => {
  // Both questions come with the same ~10 KB of <system-reminder> blocks; only the typed text is compared, so
  // another question is not served the stored answer.
  const key = stack.key("claude-code-other");
  for (const [question, expected] of [[QUESTION, "miss"], ["write a haiku about the sea", "miss"]]) {
    const before = await stack.stored();
    const { answered, records } = await run(key, question);
    assert.deepEqual([answered.status, answered.cache], [200, expected], JSON.stringify(records));
    await stack.waitStored(before);
  }
});
