// The official OpenAI Node SDK's calling styles through a real gateway (with the embedding model) in front of
// reprise-sim: for each, a first question is a `miss`, the same question again a `hit` with the same text, a paraphrase
// a `semantic-hit` with the first answer, and a streamed miss replays as a streamed hit with identical content.
// Each adapter reads x-reprise-cache as its users would (chat completions and the Responses API); a new calling style
// or route is one more entry in CLIENTS.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { outcomeOf, recordingFetch, startStack } from "./stack.mjs";

const MODEL = "sim-model";
const SYSTEM = "You answer in one short sentence.";
// Scored 0.94 by all-MiniLM-L6-v2 (threshold 0.90) and passes every guard; the Rust semantic tests use it too.
const QUESTION = "how do I reset my password";
const PARAPHRASE = "I forgot my password, how can I reset it";

const messages = (prompt) => [{ role: "system", content: SYSTEM }, { role: "user", content: prompt }];

/** `chat.completions.create(...).withResponse()`: the parsed data and the HTTP response with its headers. */
async function create(stack, apiKey, prompt, stream) {
  const client = new OpenAI({ baseURL: stack.baseURL, apiKey, maxRetries: 0 });
  const { data, response } = await client.chat.completions
    .create({ model: MODEL, messages: messages(prompt), stream })
    .withResponse();
  let text = "";
  if (stream) for await (const chunk of data) text += chunk.choices[0]?.delta?.content ?? "";
  else text = data.choices[0].message.content;
  return { ...outcomeOf(response.headers), text };
}

/**
 * The helpers: `chat.completions.stream(...)` (its `content.delta` events and final completion) and, unstreamed,
 * `chat.completions.parse(...)`. The stream helper keeps its HTTP response: the header comes from the client's fetch.
 */
async function helpers(stack, apiKey, prompt, stream) {
  const fetch = recordingFetch();
  const client = new OpenAI({ baseURL: stack.baseURL, apiKey, maxRetries: 0, fetch });
  if (!stream) {
    const parsed = await client.chat.completions.parse({ model: MODEL, messages: messages(prompt) });
    return { ...outcomeOf(fetch.one()), text: parsed.choices[0].message.content };
  }
  const events = client.chat.completions.stream({ model: MODEL, messages: messages(prompt) });
  let deltas = "";
  events.on("content.delta", ({ delta }) => (deltas += delta));
  const final = (await events.finalChatCompletion()).choices[0].message.content;
  assert.equal(deltas, final, "the helper's events and its final completion disagree");
  return { ...outcomeOf(fetch.one()), text: final };
}

/** The Responses API: `responses.create(...).withResponse()`, its typed stream's text deltas or `output_text`. */
async function responses(stack, apiKey, prompt, stream) {
  const client = new OpenAI({ baseURL: stack.baseURL, apiKey, maxRetries: 0 });
  const { data, response } = await client.responses
    .create({ model: MODEL, instructions: SYSTEM, input: prompt, stream })
    .withResponse();
  let text = "";
  if (stream) {
    for await (const event of data) if (event.type === "response.output_text.delta") text += event.delta;
  } else text = data.output_text;
  return { ...outcomeOf(response.headers), text };
}

const CLIENTS = { create, helpers, responses };

let stack;
before(async () => (stack = await startStack()));
after(async () => stack?.stop());

/**
 * Checks the header the client read, and that the gateway's own record agrees: the same outcome, and a streamed
 * request really was one. Returns the reply's text.
 */
async function served(reply, outcome, stream) {
  assert.equal(reply.outcome, outcome);
  const record = await stack.record(reply.requestId);
  assert.deepEqual([record.cache, record.stream, record.status], [outcome, stream, 200]);
  return reply.text;
}

for (const [name, ask] of Object.entries(CLIENTS)) {
  test(`${name}: a repeat is an exact hit with the same text`, async () => {
    const key = stack.key(name);
    const before = await stack.stored();
    const first = await served(await ask(stack, key, QUESTION, false), "miss", false);
    assert.ok(first);
    await stack.waitStored(before);
    assert.equal(await served(await ask(stack, key, QUESTION, false), "hit", false), first);
  });

  test(`${name}: a paraphrase is a semantic hit with the first answer`, async (t) => {
    if (!stack.semantic) return t.skip("no embedding model (run scripts/provision-models.sh)");
    const key = stack.key(name);
    const before = await stack.stored();
    const first = await served(await ask(stack, key, QUESTION, false), "miss", false);
    await stack.waitStored(before);
    // reprise-sim answers each prompt with its own words, so equal text means the stored answer was served.
    assert.equal(await served(await ask(stack, key, PARAPHRASE, false), "semantic-hit", false), first);
  });

  test(`${name}: a streamed miss replays as a streamed hit with identical content`, async () => {
    const key = stack.key(name);
    const before = await stack.stored();
    const first = await served(await ask(stack, key, QUESTION, true), "miss", true);
    assert.ok(first);
    await stack.waitStored(before);
    assert.equal(await served(await ask(stack, key, QUESTION, true), "hit", true), first);
    // The entry a stream left serves the non-streamed shape too.
    assert.equal(await served(await ask(stack, key, QUESTION, false), "hit", false), first);
  });
}
