// The admin dashboard (/admin/ui) in headless Chromium against a real `reprise serve` in front of `reprise-sim`:
// after real traffic (misses, exact repeats, a paraphrase, and Anthropic Messages API requests) the page loads without
// console errors, draws its charts from live data, counts requests by route, lists, searches and deletes entries, and leaves a screenshot in the artifacts folder.
//
// Env: REPRISE_BIN_DIR (reprise and reprise-sim; default target/debug), REPRISE_MODELS_DIR (semantic matching on when
// set, else exact-only), REPRISE_ARTIFACTS_DIR (default target/artifacts), CHROMIUM_PATH (default /usr/bin/chromium).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, waitReady } from "../processes.mjs";
import { artifactsDir, chartMarks, eventually, launchBrowser, newPage, promptsShown } from "./browser.mjs";

const binDir = process.env.REPRISE_BIN_DIR ?? join(import.meta.dirname, "../../../target/debug");
const modelsDir = process.env.REPRISE_MODELS_DIR;
const semantic = Boolean(modelsDir);
const token = "ui-test-" + Math.random().toString(36).slice(2);
const procs = [];
let gw, dataDir, browser;

const MISSES = [
  "What is the capital of France?",
  "How do I reset my password?",
  "Write a haiku about autumn rain.",
  "Explain the difference between TCP and UDP.",
];
const PARAPHRASE = "What's the capital city of France?";

function admin(path, init = {}) {
  return fetch(`${gw}/admin/${path}`, { ...init, headers: { authorization: `Bearer ${token}`, ...(init.headers ?? {}) } });
}

/** One chat request through the gateway; returns its x-reprise-cache header after reading the whole body. */
async function chat(content, { stream = false, headers = {} } = {}) {
  const res = await fetch(`${gw}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer sk-ui", ...headers },
    body: JSON.stringify({ model: "sim-model", messages: [{ role: "user", content }], stream }),
  });
  await res.text();
  assert.equal(res.status, 200, `chat ${JSON.stringify(content)}`);
  return res.headers.get("x-reprise-cache");
}

/** One Anthropic Messages API request through the gateway; returns its x-reprise-cache header. */
async function message(content) {
  const res = await fetch(`${gw}/v1/messages`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-api-key": "sk-ui", "anthropic-version": "2023-06-01" },
    body: JSON.stringify({ model: "claude-sim", max_tokens: 64, messages: [{ role: "user", content }] }),
  });
  await res.text();
  assert.equal(res.status, 200, `message ${JSON.stringify(content)}`);
  return res.headers.get("x-reprise-cache");
}

before(async () => {
  const simPort = await freePort();
  const gwPort = await freePort();
  dataDir = mkdtempSync(join(tmpdir(), "reprise-ui-"));
  procs.push(spawn(join(binDir, "reprise-sim"), ["--listen", `127.0.0.1:${simPort}`, "--ttft-ms", "40", "--itl-ms", "2", "--tokens", "12"], { stdio: "ignore" }));
  await waitReady(`http://127.0.0.1:${simPort}/healthz`);
  const matching = semantic
    ? ["--model-dir", join(modelsDir, "all-MiniLM-L6-v2"), "--ort-lib", join(modelsDir, "onnxruntime/libonnxruntime.so")]
    : ["--semantic", "false"];
  // The sim's model priced as gpt-4o is, so the savings panel shows money as well as tokens.
  const prices = join(dataDir, "prices.toml");
  writeFileSync(prices, '[models]\n"sim-model" = { input = 2.50, output = 10.00 }\n');
  procs.push(spawn(join(binDir, "reprise"), [
    "serve", "--listen", `127.0.0.1:${gwPort}`, "--upstream-url", `http://127.0.0.1:${simPort}/v1`,
    "--anthropic-upstream-url", `http://127.0.0.1:${simPort}/v1`, "--data-dir", join(dataDir, "store"), "--admin-token", token,
    "--prices", prices, ...matching,
  ], { stdio: ["ignore", "ignore", "inherit"] }));
  gw = `http://127.0.0.1:${gwPort}`;
  await waitReady(`${gw}/healthz`);
  // Say plainly when the binary predates the admin API, instead of timing out further down.
  const probe = await admin("stats");
  assert.equal(probe.status, 200, `GET /admin/stats answered ${probe.status}: this reprise has no admin API (${await probe.text()})`);

  // Misses (two of them streamed), then exact repeats once the off-path writes landed, then a paraphrase.
  for (const [i, p] of MISSES.entries()) assert.equal(await chat(p, { stream: i % 2 === 1 }), "miss");
  await eventually("entries stored", async () => {
    const page = await (await admin("entries?limit=50")).json();
    return page.data?.length === MISSES.length;
  });
  for (const p of MISSES.slice(0, 2)) {
    assert.equal(await chat(p), "hit");
    assert.equal(await chat(p, { stream: true }), "hit");
  }
  const paraphrase = await chat(PARAPHRASE);
  assert.ok(["semantic-hit", "miss"].includes(paraphrase), `paraphrase answered ${paraphrase}`);
  // The Messages API route: a miss and, once stored, its repeat.
  const ANTHROPIC = "Which rivers flow into the Black Sea?";
  assert.equal(await message(ANTHROPIC), "miss");
  await eventually("the Messages API entry stored", async () => {
    const page = await (await admin("entries?limit=50")).json();
    return page.data?.some((e) => e.prompt === ANTHROPIC);
  });
  assert.equal(await message(ANTHROPIC), "hit");

  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  procs.forEach((p) => p.kill("SIGTERM"));
  await new Promise((r) => setTimeout(r, 200));
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

test("the dashboard renders live data, searches and deletes entries", async () => {
  const { page, context, problems } = await newPage(browser);
  try {
    await page.goto(`${gw}/admin/ui#token=${encodeURIComponent(token)}`);
    await page.waitForSelector('body[data-ready="1"]', { timeout: 15000 });
    assert.equal(new URL(page.url()).hash, "", "the token must leave the address bar");

    for (const chart of ["timeline", "ttft", "phases"]) {
      assert.ok((await chartMarks(page, chart)) > 0, `${chart} chart drew nothing from live data`);
    }
    const outcomes = await page.locator('svg[data-chart="phases"] .row-label').allTextContents();
    assert.ok(outcomes.includes("Miss") && outcomes.includes("Exact hit"), `phases rows: ${outcomes}`);
    assert.equal(await page.locator("#meta .badge").first().textContent(), semantic ? "semantic" : "exact-only");

    // Counts by route, from the stats JSON the page reads: the Messages API has its own row.
    const stats = await (await admin("stats")).json();
    assert.deepEqual([stats.by_route?.messages?.total, stats.by_route?.messages?.hit, stats.by_route?.messages?.miss], [2, 1, 1],
      JSON.stringify(stats.by_route));
    assert.ok(stats.by_route["chat.completions"]?.total >= MISSES.length + 4, JSON.stringify(stats.by_route));
    const system = await page.locator("#system").textContent();
    assert.ok(system.includes("By route") && system.includes("messages2 · 1 hits · 1 misses"), system);

    const shown = await promptsShown(page);
    for (const p of MISSES) assert.ok(shown.includes(p), `entries table lacks ${JSON.stringify(p)}: ${JSON.stringify(shown)}`);

    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: join(artifactsDir(), "dashboard.png"), fullPage: true });

    // Savings: the panel and the money KPI show what /admin/stats says, which is the sum over the
    // request records of the hits.
    const now = await (await admin("stats")).json();
    const records = (await (await admin("requests?limit=1000")).json()).data;
    const saved = records.filter((r) => r.saved).map((r) => r.saved);
    const total = now.savings.total;
    assert.equal(saved.length, total.hits, JSON.stringify(now.savings));
    assert.ok(total.hits >= 4, `hits with savings: ${total.hits}`);
    assert.equal(saved.reduce((a, x) => a + x.input_tokens, 0), total.input_tokens);
    assert.equal(saved.reduce((a, x) => a + x.output_tokens, 0), total.output_tokens);
    assert.ok(Math.abs(saved.reduce((a, x) => a + x.cost_usd, 0) - total.cost_usd) < 1e-9);
    assert.ok(total.cost_usd > 0 && total.counted >= 1, JSON.stringify(total));
    const modelRow = page.locator("#savings-table tbody tr", { hasText: "sim-model" });
    await eventually("savings row", async () => (await modelRow.count()) === 1);
    const cells = await modelRow.locator("td").allTextContents();
    const simModel = now.savings.by_model["sim-model"];
    assert.equal(cells[2], String(simModel.hits), cells.join(" | "));
    assert.equal(Number(cells[3].replace(/[^0-9]/g, "")), simModel.input_tokens, cells.join(" | "));
    assert.ok((await page.locator("#kpi-money").textContent()).startsWith("$"));
    assert.ok((await page.locator("#savings-callout").textContent()).includes("counted with a tokenizer"));
    await page.locator("#savings-panel").screenshot({ path: join(artifactsDir(), "dashboard-savings.png") });

    // Search: by meaning in semantic mode (server-side, with similarity), by text over loaded rows in exact-only mode.
    await page.fill("#search", semantic ? "forgot my password, how to change it" : "haiku");
    const expected = semantic ? "How do I reset my password?" : "Write a haiku about autumn rain.";
    await eventually("search results", async () => (await promptsShown(page))[0] === expected);
    if (semantic) assert.ok((await page.locator("#entries-head th").allTextContents()).includes("Similarity"));
    else assert.equal((await promptsShown(page)).length, 1);
    await page.fill("#search", "");
    await eventually("rows back after clearing the search", async () => (await promptsShown(page)).length >= MISSES.length);

    // Delete (the page asks to confirm; the test accepts): the row goes, and so does the entry.
    const row = page.locator("#entries-body tr[data-entry-id]", { hasText: "Write a haiku about autumn rain." });
    const id = await row.getAttribute("data-entry-id");
    await row.locator('button[data-action="delete"]').click();
    await eventually("deleted row gone", async () => (await page.locator(`tr[data-entry-id="${id}"]`).count()) === 0);
    assert.equal((await admin(`entries/${id}`)).status, 404);
    // And it stays gone after the next refresh.
    await page.waitForTimeout(5500);
    assert.equal(await page.locator(`tr[data-entry-id="${id}"]`).count(), 0);

    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});

test("shadow decisions from real traffic, judged from the dashboard", async () => {
  // A paraphrase in shadow mode goes upstream and, with semantic matching on, is recorded with its candidate.
  const shadowHeaders = { "x-reprise-cache-mode": "shadow", "cache-control": "no-store" };
  assert.equal(await chat("I forgot my password, how can I reset it?", { headers: shadowHeaders }), "miss");
  const decisions = await (await admin("shadow")).json();
  assert.equal(decisions.data.length, semantic ? 1 : 0, JSON.stringify(decisions));
  const { page, context, problems } = await newPage(browser);
  try {
    await page.goto(`${gw}/admin/ui#token=${encodeURIComponent(token)}`);
    await page.waitForSelector('body[data-ready="1"]', { timeout: 15000 });
    if (!semantic) {
      // Exact-only: nothing to shadow, no panel.
      assert.ok(await page.locator("#shadow-panel").isHidden());
    } else {
      const d = decisions.data[0];
      const row = page.locator(`#shadow-body tr[data-request-id="${d.request_id}"]`);
      await row.waitFor();
      const text = await row.textContent();
      assert.ok(text.includes("How do I reset my password?") && text.includes(d.similarity.toFixed(4)), text);
      await row.locator('button[data-verdict="wrong"]').click();
      await eventually("verdict stored", async () => (await (await admin("stats")).json()).feedback.wrong === 1);
      await eventually("verdict shown", async () => (await row.textContent()).includes("wrong"));
      const verdicts = await (await admin("feedback")).json();
      assert.equal(verdicts.data[0].request_id, d.request_id);
    }
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
  }
});
