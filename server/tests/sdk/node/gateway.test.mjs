// The official OpenAI Node SDK works through the gateway with only baseURL changed.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, waitReady } from "../../processes.mjs";
import OpenAI from "openai";

const binDir = process.env.REPRISE_BIN_DIR ?? join(import.meta.dirname, "../../../../target/debug");
const procs = [];
let gateway, sim;

before(async () => {
  const simPort = await freePort();
  const gwPort = await freePort();
  procs.push(spawn(join(binDir, "reprise-sim"), ["--listen", `127.0.0.1:${simPort}`, "--ttft-ms", "20", "--itl-ms", "1", "--tokens", "10"], { stdio: "ignore" }));
  await waitReady(`http://127.0.0.1:${simPort}/healthz`, 400);
  procs.push(spawn(join(binDir, "reprise"), ["serve", "--listen", `127.0.0.1:${gwPort}`, "--upstream-url", `http://127.0.0.1:${simPort}/v1`, "--data-dir", mkdtempSync(join(tmpdir(), "reprise-node-"))], { stdio: "ignore" }));
  await waitReady(`http://127.0.0.1:${gwPort}/healthz`, 400);
  sim = new OpenAI({ baseURL: `http://127.0.0.1:${simPort}/v1`, apiKey: "sk-node", maxRetries: 0 });
  gateway = new OpenAI({ baseURL: `http://127.0.0.1:${gwPort}/v1`, apiKey: "sk-node", maxRetries: 0 });
});

after(() => procs.forEach((p) => p.kill("SIGTERM")));

const messages = [{ role: "user", content: "Hello from Node" }];

async function streamText(client, msgs) {
  let text = "";
  const stream = await client.chat.completions.create({ model: "sim-model", messages: msgs, stream: true });
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
  return text;
}

test("streaming and non-streaming chat match the upstream, then hit the cache", async () => {
  const direct = await streamText(sim, messages);
  assert.equal(await streamText(gateway, messages), direct);
  // Give the off-path write a moment, then the same request is a hit with the same text.
  let raw;
  for (let i = 0; i < 50; i++) {
    raw = await gateway.chat.completions.create({ model: "sim-model", messages }).withResponse();
    if (raw.response.headers.get("x-reprise-cache") === "hit") break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(raw.response.headers.get("x-reprise-cache"), "hit");
  assert.equal(raw.data.choices[0].message.content, direct);
});

test("errors surface as the SDK's error classes", async () => {
  await assert.rejects(
    gateway.chat.completions.create({ model: "sim-model", messages: [{ role: "user", content: "node 503" }] }, { headers: { "x-sim-fault": "status=503" } }),
    (err) => err instanceof OpenAI.APIError && err.status === 503,
  );
  await assert.rejects(
    gateway.chat.completions.create({ model: "sim-model", messages: "nope" }),
    (err) => err instanceof OpenAI.BadRequestError && err.param === "messages",
  );
  await assert.rejects(async () => {
    const stream = await gateway.chat.completions.create(
      { model: "sim-model", messages: [{ role: "user", content: "node cut" }], stream: true },
      { headers: { "x-sim-fault": "cut=2" } },
    );
    for await (const _ of stream) {
    }
  }, OpenAI.APIError);
});
