// The official Anthropic TypeScript SDK (`@anthropic-ai/sdk`) through a real gateway (with the embedding model) in
// front of reprise-sim's Messages API: a first question is a `miss`, the same question again a `hit` with the same
// text, a paraphrase a `semantic-hit` with the first answer, and a streamed miss (`messages.stream(...)` and its
// `finalMessage()`) replays as a streamed hit with identical content. The client gets the gateway's address without
// `/v1`, as Anthropic's clients expect.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { outcomeOf, recordingFetch, startStack } from "./stack.mjs";

const MODEL = "claude-sim";
const SYSTEM = "You answer in one short sentence.";
// The pair the OpenAI tests use: scored 0.94 by all-MiniLM-L6-v2 (threshold 0.90), passes every guard.
const QUESTION = "how do I reset my password";
const PARAPHRASE = "I forgot my password, how can I reset it";

const ask = (prompt) => ({
  model: MODEL, max_tokens: 256, system: SYSTEM, messages: [{ role: "user", content: prompt }],
});
const textOf = (message) => message.content.filter((b) => b.type === "text").map((b) => b.text).join("");

/** `messages.create(...).withResponse()`: the message (or its raw event stream) and the response's headers. */
async function create(stack, apiKey, prompt, stream) {
  const client = new Anthropic({ baseURL: stack.url, apiKey, maxRetries: 0 });
  const { data, response } = await client.messages.create({ ...ask(prompt), stream }).withResponse();
  let text = "";
  if (stream) {
    for await (const event of data) {
      if (event.type === "content_block_delta" && event.delta.type === "text_delta") text += event.delta.text;
    }
  } else text = textOf(data);
  return { ...outcomeOf(response.headers), text };
}

/**
 * The helper: `messages.stream(...)` with its `text` events and `finalMessage()`; it keeps its HTTP response, so the
 * header comes from the client's fetch. Unstreamed, a plain `messages.create` read the same way.
 */
async function helpers(stack, apiKey, prompt, stream) {
  const fetch = recordingFetch();
  const client = new Anthropic({ baseURL: stack.url, apiKey, maxRetries: 0, fetch });
  if (!stream) {
    const message = await client.messages.create(ask(prompt));
    return { ...outcomeOf(fetch.one()), text: textOf(message) };
  }
  const events = client.messages.stream(ask(prompt));
  let deltas = "";
  events.on("text", (delta) => (deltas += delta));
  const final = textOf(await events.finalMessage());
  assert.equal(deltas, final, "the helper's text events and its final message disagree");
  return { ...outcomeOf(fetch.one()), text: final };
}

const CLIENTS = { create, helpers };

let stack;
before(async () => (stack = await startStack()));
after(async () => stack?.stop());

/** Checks the header the client read, and that the gateway's record agrees (outcome, stream, status, route). */
async function served(reply, outcome, stream) {
  assert.equal(reply.outcome, outcome);
  const record = await stack.record(reply.requestId);
  assert.deepEqual([record.cache, record.stream, record.status], [outcome, stream, 200]);
  return reply.text;
}

for (const [name, client] of Object.entries(CLIENTS)) {
  test(`anthropic ${name}: a repeat is an exact hit with the same text`, async () => {
    const key = stack.key(`anthropic-${name}`);
    const before = await stack.stored();
    const first = await served(await client(stack, key, QUESTION, false), "miss", false);
    assert.ok(first);
    await stack.waitStored(before);
    assert.equal(await served(await client(stack, key, QUESTION, false), "hit", false), first);
  });

  test(`anthropic ${name}: a paraphrase is a semantic hit with the first answer`, async (t) => {
    if (!stack.semantic) return t.skip("no embedding model (run scripts/provision-models.sh)");
    const key = stack.key(`anthropic-${name}`);
    const before = await stack.stored();
    const first = await served(await client(stack, key, QUESTION, false), "miss", false);
    await stack.waitStored(before);
    // reprise-sim answers each prompt with its own words, so equal text means the stored answer was served.
    assert.equal(await served(await client(stack, key, PARAPHRASE, false), "semantic-hit", false), first);
  });

  test(`anthropic ${name}: a streamed miss replays as a streamed hit with identical content`, async () => {
    const key = stack.key(`anthropic-${name}`);
    const before = await stack.stored();
    const first = await served(await client(stack, key, QUESTION, true), "miss", true);
    assert.ok(first);
    await stack.waitStored(before);
    assert.equal(await served(await client(stack, key, QUESTION, true), "hit", true), first);
    // The entry a stream left serves the non-streamed shape too.
    assert.equal(await served(await client(stack, key, QUESTION, false), "hit", false), first);
  });
}
