// Shared by the dashboard tests: headless Debian Chromium through playwright-core, a page that records every console
// error, page error and unexpected dialog, and the artifacts folder screenshots go to.
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const repoRoot = resolve(import.meta.dirname, "../../..");

/** Where screenshots go: `$REPRISE_ARTIFACTS_DIR`, else `target/artifacts` in the repository. */
export function artifactsDir() {
  const dir = process.env.REPRISE_ARTIFACTS_DIR ? resolve(process.env.REPRISE_ARTIFACTS_DIR) : join(repoRoot, "target/artifacts");
  mkdirSync(dir, { recursive: true });
  return dir;
}

/** Debian's chromium package (playwright-core downloads no browser); `CHROMIUM_PATH` overrides. */
export function launchBrowser() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"],
  });
}

/**
 * A fresh page (own context, so no sessionStorage carries over) that collects problems in `problems`:
 * console errors, uncaught page errors and any dialog other than the delete confirmation, which it accepts.
 */
export async function newPage(browser, { colorScheme = "light" } = {}) {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, colorScheme });
  const page = await context.newPage();
  const problems = [];
  const dialogs = [];
  page.on("console", (msg) => {
    if (msg.type() === "error") problems.push(`console error: ${msg.text()}`);
  });
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));
  page.on("dialog", async (dialog) => {
    dialogs.push(dialog.message());
    if (dialog.type() === "confirm") await dialog.accept();
    else {
      problems.push(`unexpected ${dialog.type()} dialog: ${dialog.message()}`);
      await dialog.dismiss();
    }
  });
  return { page, context, problems, dialogs };
}

/** How many data marks (bars, segments, points) a chart drew. */
export function chartMarks(page, name) {
  return page.locator(`svg[data-chart="${name}"] .mark`).count();
}

/** The prompt cells of the entries table, in order. */
export async function promptsShown(page) {
  return page.locator("#entries-body tr[data-entry-id] td.prompt > span:first-child").allTextContents();
}

/** Waits until `fn()` returns a truthy value (polling), or throws with `what` after `ms`. */
export async function eventually(what, fn, ms = 10000) {
  const end = Date.now() + ms;
  let last;
  while (Date.now() < end) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what} (last value: ${JSON.stringify(last)})`);
}
