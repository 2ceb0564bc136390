// The dashboard against a contract-shaped mock of the admin API (mock-admin.mjs): every UI path that a real gateway
// cannot easily be put into on demand (exact-only, empty, many pages, wrong token, hostile prompt text), checked in
// headless Chromium. The real-gateway test is dashboard.test.mjs.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { startMock, MOCK_PROMPTS } from "./mock-admin.mjs";
import { artifactsDir, chartMarks, eventually, launchBrowser, newPage, promptsShown } from "./browser.mjs";

let browser;
before(async () => {
  browser = await launchBrowser();
});
after(async () => {
  await browser?.close();
});

async function openReady(mock, options) {
  const tab = await newPage(browser, options);
  await tab.page.goto(`${mock.url}/admin/ui#token=${encodeURIComponent(mock.token)}`);
  await tab.page.waitForSelector('body[data-ready="1"]', { timeout: 10000 });
  return tab;
}

test("semantic mode: charts, entries, escaping, search, detail drawer and delete", async () => {
  const mock = await startMock({ mode: "semantic" });
  const { page, context, problems } = await openReady(mock);
  try {
    // The token left the address bar but is kept for the tab.
    assert.equal(new URL(page.url()).hash, "");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("reprise.admin.token")), mock.token);

    for (const chart of ["timeline", "ttft", "phases"]) {
      assert.ok((await chartMarks(page, chart)) > 0, `${chart} chart drew no marks`);
    }
    // One phases row per outcome in the window, stacked from at most five segments.
    const phaseRows = await page.locator('svg[data-chart="phases"] .row-label').allTextContents();
    assert.deepEqual(phaseRows, ["Miss", "Semantic hit", "Exact hit", "Coalesced"]);

    const hitRate = await page.locator("#kpis .kpi").first().locator(".value").textContent();
    assert.equal(hitRate, (mock.data.stats.rates.hit * 100).toFixed(1) + "%");
    // The exact share is read from `exact-hit`, spelled as the outcomes are.
    const split = await page.locator("#kpis .kpi").first().textContent();
    assert.ok(split.includes((mock.data.stats.rates["exact-hit"] * 100).toFixed(1) + "% exact"), split);
    // A hit's first token is its replay's, not a prefill: the segment is named for what both have.
    const phaseLegend = await page.locator("#phases-legend").textContent();
    assert.ok(phaseLegend.includes("First token") && !phaseLegend.includes("Prefill"), phaseLegend);
    const refusals = page.locator("#system dt", { hasText: "Guard refusals" }).locator("xpath=following-sibling::dd[1]");
    assert.equal(
      await refusals.textContent(),
      "7 numbers · 3 negation · 0 format · 1 task · 2 direction · 4 antonym · 5 entity · 1 template",
    );
    // Recent requests: a miss names its best candidate and the guard that refused it.
    const firstRequest = await page.locator("#requests-body tr").first().textContent();
    assert.ok(firstRequest.includes("nearest 0.943 · numbers guard"), firstRequest);

    const prompts = await promptsShown(page);
    assert.equal(prompts.length, MOCK_PROMPTS.length);
    assert.deepEqual(new Set(prompts), new Set(MOCK_PROMPTS.map(([p]) => p)));
    // A prompt that is HTML shows as text and runs nothing.
    assert.ok(prompts.includes(MOCK_PROMPTS[9][0]));
    assert.equal(await page.evaluate(() => window.__xss), undefined);
    assert.equal(await page.locator("#entries-body img").count(), 0);

    await page.screenshot({ path: join(artifactsDir(), "dashboard-mock.png"), fullPage: true });

    // Semantic search goes to the server with q and shows similarity, best first.
    await page.fill("#search", "password reset");
    await eventually("search results", async () => (await promptsShown(page))[0] === "How do I reset my password?");
    assert.deepEqual(mock.log.searches.at(-1), "password reset");
    assert.ok((await page.locator("#entries-head th").allTextContents()).includes("Similarity"));
    await page.fill("#search", "");
    await eventually("all rows back", async () => (await promptsShown(page)).length === MOCK_PROMPTS.length);

    // The drawer loads the full entry: answer, phases of the stored miss, hit history.
    const withHits = mock.data.entries.find((e) => e._history.length >= 2);
    await page.locator(`tr[data-entry-id="${withHits.id}"] td.prompt`).click();
    await page.waitForSelector("#drawer:not([hidden])");
    await eventually("drawer content", async () => (await page.locator("#drawer-body").textContent()).includes(withHits._answer.slice(0, 40)));
    assert.equal(await page.locator("#drawer-body tbody tr").count(), withHits._history.length);
    await page.keyboard.press("Escape");
    assert.ok(await page.locator("#drawer").isHidden());

    // Delete asks first, removes the row and the entry.
    const victim = mock.data.entries.find((e) => e.prompt === "Why is the sky blue?");
    await page.locator(`tr[data-entry-id="${victim.id}"] button[data-action="delete"]`).click();
    await eventually("row removed", async () => (await page.locator(`tr[data-entry-id="${victim.id}"]`).count()) === 0);
    assert.deepEqual(mock.log.deletes, [victim.id]);
    const res = await fetch(`${mock.url}/admin/entries/${victim.id}`, { headers: { authorization: `Bearer ${mock.token}` } });
    assert.equal(res.status, 404);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("refreshes every 5 s from live data, and Pause stops it", async () => {
  const mock = await startMock({ mode: "semantic" });
  const { page, context, problems } = await openReady(mock);
  try {
    const fresh = { ...mock.data.entries[0], id: "e_0000000000ff", prompt: "A prompt cached after the page loaded" };
    mock.data.entries.unshift(fresh);
    await eventually("the new entry after a refresh", async () => (await promptsShown(page)).includes(fresh.prompt), 8000);

    await page.click("#pause");
    assert.equal(await page.getAttribute("#pause", "aria-pressed"), "true");
    const later = { ...fresh, id: "e_0000000000fe", prompt: "Cached while the dashboard was paused" };
    mock.data.entries.unshift(later);
    await page.waitForTimeout(6000);
    assert.ok(!(await promptsShown(page)).includes(later.prompt), "a paused dashboard refreshed");
    await page.click("#pause");
    await eventually("refresh on resume", async () => (await promptsShown(page)).includes(later.prompt), 3000);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("cursor paging: Load more appends the next page", async () => {
  const mock = await startMock({ mode: "semantic", entries: 120 });
  const { page, context, problems } = await openReady(mock);
  try {
    assert.equal((await promptsShown(page)).length, 50);
    await page.click("#load-more");
    await eventually("second page", async () => (await promptsShown(page)).length === 100);
    await page.click("#load-more");
    await eventually("last page", async () => (await promptsShown(page)).length === 120);
    assert.ok(await page.locator("#load-more").isHidden());
    const ids = await page.locator("#entries-body tr[data-entry-id]").evaluateAll((rows) => rows.map((r) => r.dataset.entryId));
    assert.deepEqual(ids, mock.data.entries.map((e) => e.id));
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("exact-only mode: no vector index, search filters the loaded rows locally", async () => {
  const mock = await startMock({ mode: "exact-only" });
  const { page, context, problems } = await openReady(mock, { colorScheme: "dark" });
  try {
    assert.equal(await page.locator("#meta .badge").first().textContent(), "exact-only");
    for (const chart of ["timeline", "ttft", "phases"]) assert.ok((await chartMarks(page, chart)) > 0, chart);
    await page.fill("#search", "haiku");
    await eventually("local filter", async () => {
      const shown = await promptsShown(page);
      return shown.length === 1 && shown[0] === "Write a haiku about autumn rain.";
    });
    assert.deepEqual(mock.log.searches, [], "exact-only mode must not send q");
    await page.screenshot({ path: join(artifactsDir(), "dashboard-mock-exact-dark.png"), fullPage: true });
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("no traffic yet: renders empty states without errors", async () => {
  const mock = await startMock({ mode: "empty" });
  const { page, context, problems } = await openReady(mock);
  try {
    for (const chart of ["timeline", "ttft", "phases"]) {
      assert.equal(await page.locator(`svg[data-chart="${chart}"]`).count(), 1);
      assert.equal(await chartMarks(page, chart), 0);
    }
    assert.match(await page.locator("#entries-body").textContent(), /cache is empty/);
    assert.equal(await page.locator("#kpis .kpi .value").first().textContent(), "0%");
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("without a token asks for one; a wrong token is rejected, the right one opens the dashboard", async () => {
  const mock = await startMock({ mode: "semantic" });
  const { page, context, problems } = await newPage(browser);
  try {
    await page.goto(`${mock.url}/admin/ui`);
    await page.waitForSelector("#login:not([hidden])");
    assert.ok(await page.locator("#app").isHidden());

    await page.fill("#token-input", "wrong-token");
    await page.click("#login-form button[type=submit]");
    await eventually("rejection message", async () => (await page.locator("#login-error").isVisible()) && (await page.locator("#login-error").textContent()));
    assert.match(await page.locator("#login-error").textContent(), /rejected/);
    assert.equal(await page.evaluate(() => sessionStorage.getItem("reprise.admin.token")), null);

    await page.fill("#token-input", mock.token);
    await page.click("#login-form button[type=submit]");
    await page.waitForSelector('body[data-ready="1"]');
    assert.ok((await promptsShown(page)).length > 0);
    // The browser logs the 401 responses themselves as console errors; nothing else may fail.
    assert.deepEqual(problems.filter((p) => !/status of 401/.test(p)), []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("shadow decisions: what would be served, each guard's verdict, and feedback buttons", async () => {
  const mock = await startMock({ mode: "semantic" });
  const { page, context, problems } = await openReady(mock);
  try {
    await page.waitForSelector("#shadow-panel:not([hidden])");
    const rows = page.locator("#shadow-body tr");
    assert.equal(await rows.count(), 3);
    const refused = await page.locator('#shadow-body tr[data-request-id="req_s3"]').textContent();
    // A running guard by name; one that is off but would refuse, in parentheses.
    assert.ok(refused.includes("refused") && refused.includes("direction, (antonym)"), refused);
    assert.ok(refused.includes("0.9896") && refused.includes("Can I cancel my order after it ships?"), refused);
    assert.ok((await page.locator('#shadow-body tr[data-request-id="req_s1"]').textContent()).includes("below threshold"));
    // The judge's verdict on a decision, when verify = judge asked one.
    assert.ok((await page.locator('#shadow-body tr[data-request-id="req_s2"]').textContent()).includes("same"));
    const judge = page.locator("#system dt", { hasText: "Judge calls" }).locator("xpath=following-sibling::dd[1]");
    assert.equal(await judge.textContent(), "41 · 30 same · 9 different · 2 unsure");
    const verdicts = page.locator("#system dt", { hasText: "Verdicts support" }).locator("xpath=following-sibling::dd[1]");
    assert.equal(await verdicts.textContent(), "39 · 9 wrong (23.1%)");

    await page.locator('#shadow-body tr[data-request-id="req_s2"] button[data-verdict="right"]').click();
    await eventually("verdict shown", async () => (await page.locator('#shadow-body tr[data-request-id="req_s2"]').textContent()).includes("right"));
    assert.equal(await page.locator('#shadow-body tr[data-request-id="req_s2"] button').count(), 0);
    await page.locator('#shadow-body tr[data-request-id="req_s3"] button[data-verdict="wrong"]').click();
    await eventually("second verdict", async () => mock.log.verdicts.length === 2);
    assert.deepEqual(mock.log.verdicts, [["req_s2", "right"], ["req_s3", "wrong"]]);
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});

test("no shadow decisions: no shadow panel", async () => {
  const mock = await startMock({ mode: "exact-only" });
  const { page, context, problems } = await openReady(mock);
  try {
    assert.ok(await page.locator("#shadow-panel").isHidden());
    assert.deepEqual(problems, []);
  } finally {
    await context.close();
    await mock.close();
  }
});
