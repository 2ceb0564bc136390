// A stand-in for the gateway's admin API, shaped exactly like /work/contract/admin-api.md, so the dashboard can be
// developed and tested before (and independently of) the real routes. It serves server/assets/dashboard.html at
// /admin/ui and plausible, deterministic data behind bearer auth. Not a fake of the cache: it never forwards anything.
//
// Run alone for manual work: `node mock-admin.mjs [semantic|exact-only|empty] [port]` prints the dashboard URL.
import http from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

export const HTML_PATH = join(import.meta.dirname, "../../assets/dashboard.html");

// Seeded PRNG: the same mode always gives the same numbers, so screenshots compare across runs.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export const MOCK_PROMPTS = [
  ["What is the capital of France?", "The capital of France is Paris.", "gpt-4o-mini", null],
  ["Summarize the plot of Hamlet in two sentences.", "Prince Hamlet seeks revenge on his uncle Claudius, who murdered his father to seize the throne. His hesitation and feigned madness lead to a tragic chain of deaths, including his own.", "gpt-4o", null],
  ["How do I reset my password?", "Open Settings → Account → Security and choose “Reset password”. You will receive an email with a link that is valid for 30 minutes.", "gpt-4o-mini", "support"],
  ["Can I get a refund after 30 days?", "Refunds are available within 30 days of purchase. After that, contact support and we will review your case individually.", "gpt-4o-mini", "support"],
  ["Explain the difference between TCP and UDP.", "TCP is connection-oriented and guarantees ordered, reliable delivery; UDP is connectionless and sends datagrams without delivery guarantees, which makes it lighter and faster.", "gpt-4o", "docs"],
  ["Write a haiku about autumn rain.", "Cold rain on red leaves / the gutter hums a low song / the lamp stays lit late", "gpt-4o-mini", null],
  ["What are the opening hours of the Berlin office?", "The Berlin office is open Monday to Friday, 9:00 to 18:00 CET.", "gpt-4o-mini", "support"],
  ["Translate 'good morning' into Japanese.", "Good morning in Japanese is おはようございます (ohayō gozaimasu).", "gpt-4o-mini", null],
  ["How does HNSW approximate nearest neighbour search work?", "HNSW builds a layered proximity graph; searches start at the sparse top layer and greedily descend, refining candidates in denser layers.", "gpt-4o", "docs"],
  ["<img src=x onerror=\"window.__xss=1\"> is this HTML escaped?", "It should appear as text, never as an image.", "gpt-4o-mini", "qa"],
  ["List three uses of a Bloom filter.", "Cache admission, avoiding disk lookups for absent keys, and de-duplicating URLs in a crawler.", "gpt-4o-mini", "docs"],
  ["What is the boiling point of water at sea level?", "Water boils at 100 °C (212 °F) at sea level.", "gpt-4o-mini", null],
  ["How do I rotate an API key?", "Create a new key in the dashboard, deploy it, then revoke the old key once traffic has moved.", "gpt-4o-mini", "support"],
  ["Give me a SQL query that counts orders per customer.", "SELECT customer_id, COUNT(*) AS orders FROM orders GROUP BY customer_id ORDER BY orders DESC;", "gpt-4o", "docs"],
  ["Why is the sky blue?", "Sunlight scatters off air molecules, and shorter blue wavelengths scatter much more than red ones (Rayleigh scattering).", "gpt-4o-mini", null],
  ["What's the shipping time to Canada?", "Orders to Canada usually arrive within 5–8 business days.", "gpt-4o-mini", "support"],
  ["Explain what a p99 latency is, briefly.", "The p99 latency is the value below which 99% of the measured request latencies fall.", "gpt-4o-mini", "docs"],
  ["Suggest a name for a caching proxy.", "Reprise: it plays back what it has already heard.", "gpt-4o", null],
  ["How many continents are there?", "There are seven continents: Africa, Antarctica, Asia, Australia, Europe, North America and South America.", "gpt-4o-mini", null],
  ["Draft a polite reminder email about an unpaid invoice.", "Subject: Friendly reminder — invoice #1042\n\nHi Sam,\n\nJust a quick reminder that invoice #1042 was due last Friday. Could you let me know when we can expect payment?\n\nThanks,\nAlex", "gpt-4o", "support"],
  ["What does HTTP status 429 mean?", "429 Too Many Requests: the client sent too many requests in a given time and should back off.", "gpt-4o-mini", "docs"],
  ["Convert 5 miles to kilometres.", "5 miles is about 8.05 kilometres.", "gpt-4o-mini", null],
  ["Is the API available in the EU region?", "Yes. Set the base URL to the EU endpoint to keep data in the EU.", "gpt-4o-mini", "support"],
  ["Which sorting algorithm is stable: quicksort or mergesort?", "Mergesort is stable; the usual in-place quicksort is not.", "gpt-4o", "docs"],
];

const OUTCOMES = ["hit", "semantic-hit", "miss", "coalesced"];
const BOUNDS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

function words(text) {
  return new Set(String(text).toLowerCase().match(/[a-z0-9]+/g) || []);
}
// A bag-of-words cosine: enough to rank prompts the way a person expects in a demo, and deterministic.
function similarity(a, b) {
  const wa = words(a);
  const wb = words(b);
  if (!wa.size || !wb.size) return 0;
  let common = 0;
  for (const w of wa) if (wb.has(w)) common++;
  return common / Math.sqrt(wa.size * wb.size);
}

function quantiles(rand, center, spread) {
  const p50 = center * (0.92 + rand() * 0.1);
  return { p50, p90: p50 * (1 + spread), p99: p50 * (1 + spread * 2.4), mean: p50 * (1 + spread * 0.3) };
}

/** `count`: how many entries to make (the prompts repeat as numbered variants past the list), for paging tests. */
export function buildData(mode, now = Date.now(), count = MOCK_PROMPTS.length) {
  const rand = rng(mode === "exact-only" ? 7 : 42);
  const semantic = mode !== "exact-only";
  const empty = mode === "empty";
  const entries = [];
  if (!empty) {
    const base = MOCK_PROMPTS;
    const rows = Array.from({ length: count }, (_, i) => {
      const [prompt, answer, model, namespace] = base[i % base.length];
      return [i < base.length ? prompt : `${prompt} (variant ${Math.floor(i / base.length)})`, answer, model, namespace];
    });
    rows.forEach(([prompt, answer, model, namespace], i) => {
      const age = Math.round((rows.length - i) * 47 + rand() * 30);
      const ttft = 180 + rand() * 700;
      const hits = Math.floor(rand() * rand() * 14);
      const idNum = 0x10 + i;
      const decode = 200 + rand() * 1400;
      entries.push({
        id: "e_" + idNum.toString(16).padStart(12, "0"),
        object: "reprise.entry",
        route: "chat.completions",
        model,
        namespace,
        tenant: "shared",
        prompt,
        stream: i % 3 !== 0,
        answer_preview: answer.slice(0, 200),
        created_at_ms: now - age * 1000,
        expires_at_ms: now - age * 1000 + 604800000,
        age_s: age,
        hit_count: hits,
        last_hit_ms: hits ? now - Math.round(rand() * age) * 1000 : null,
        bytes: 900 + answer.length * 9,
        ttft_cost_ms: ttft,
        tokens: Math.max(4, Math.round(answer.length / 4)),
        warmed: i === 6,
        // Detail-only fields, dropped from summaries below.
        _answer: answer,
        _phases: {
          ingress_ms: 0.08 + rand() * 0.1, lookup_ms: 0.2 + rand() * 0.2,
          embed_ms: semantic ? 3 + rand() * 4 : null, search_ms: semantic ? 0.2 + rand() * 0.4 : null,
          upstream_send_ms: 0.8 + rand() * 2, ttft_ms: ttft, decode_ms: decode, downstream_ms: 0.3 + rand() * 0.5,
          total_ms: ttft + decode + 5, tokens: Math.round(answer.length / 4), completion_tokens: Math.round(answer.length / 4),
          itl_p50_ms: 18 + rand() * 10, itl_p99_ms: 45 + rand() * 40, tokens_per_s: 35 + rand() * 20,
        },
        _history: Array.from({ length: Math.min(hits, 32) }, (_, k) => {
          const kind = semantic && k % 3 === 1 ? "semantic-hit" : k % 5 === 4 ? "coalesced" : "hit";
          const t = kind === "semantic-hit" ? 5 + rand() * 3 : 0.3 + rand() * 0.3;
          return {
            at_ms: now - (hits - k) * 20000, kind, similarity: kind === "semantic-hit" ? 0.9 + rand() * 0.08 : null,
            request_id: "req_" + (0x5a00 + k * 7 + i).toString(16), ttft_ms: t, ttft_saved_ms: ttft - t,
          };
        }),
      });
    });
    entries.reverse(); // newest first
  }

  // Timeline: 10 s buckets over the last ~8 minutes with a warm-up ramp; quiet buckets are omitted, as the contract allows.
  const bucketS = 10;
  const buckets = [];
  if (!empty) {
    const nowBucket = Math.floor(now / (bucketS * 1000)) * bucketS * 1000;
    for (let i = 47; i >= 0; i--) {
      if (rand() < 0.12) continue;
      const warm = Math.min(1, (48 - i) / 30);
      const volume = 6 + Math.floor(rand() * 18);
      const hitShare = 0.15 + warm * 0.5 + (rand() - 0.5) * 0.1;
      const hit = Math.round(volume * hitShare * 0.72);
      const sem = semantic ? Math.round(volume * hitShare * 0.2) : 0;
      const coal = Math.round(volume * hitShare * 0.08);
      const bypass = rand() < 0.3 ? 1 : 0;
      buckets.push({ start_ms: nowBucket - i * bucketS * 1000, hit, "semantic-hit": sem, miss: Math.max(0, volume - hit - sem - coal), coalesced: coal, bypass });
    }
  }
  const sum = (k) => buckets.reduce((a, b) => a + b[k], 0);
  const req = {
    hit: sum("hit"), "semantic-hit": sum("semantic-hit"), miss: sum("miss"), coalesced: sum("coalesced"), bypass: sum("bypass"),
    refresh: empty ? 0 : 2, pass: empty ? 0 : 14, errors: empty ? 0 : 1,
  };
  req.total = req.hit + req["semantic-hit"] + req.miss + req.coalesced + req.bypass + req.refresh + req.pass;
  const cacheable = req.hit + req["semantic-hit"] + req.coalesced + req.miss + req.bypass + req.refresh;
  const rate = (x) => (cacheable ? x / cacheable : 0);

  // Histograms: hits sub-millisecond, semantic hits a few ms (embedding), misses a few hundred ms.
  const hist = (n, centerIdx, width) => {
    const out = new Array(BOUNDS.length + 1).fill(0);
    for (let i = 0; i < n; i++) {
      const idx = Math.max(0, Math.min(BOUNDS.length, Math.round(centerIdx + (rand() + rand() + rand() - 1.5) * width)));
      out[idx]++;
    }
    return out;
  };
  const by = {};
  if (req.hit) by.hit = hist(req.hit, 0.7, 1.4);
  if (req["semantic-hit"]) by["semantic-hit"] = hist(req["semantic-hit"], 3.6, 1.3);
  if (req.miss) by.miss = hist(req.miss, 8.6, 2.4);
  if (req.coalesced) by.coalesced = hist(req.coalesced, 7.2, 2.6);

  const phasesFor = (k) => {
    const q = (c, sp) => quantiles(rand, c, sp);
    const gate = { ingress_ms: q(0.11, 0.5), lookup_ms: q(0.28, 0.6) };
    if (k === "miss") {
      return { ...gate, embed_ms: semantic ? q(4.6, 0.8) : null, search_ms: semantic ? q(0.35, 0.6) : null, upstream_send_ms: q(1.4, 0.9),
        ttft_ms: q(412, 0.7), decode_ms: q(780, 0.6), downstream_ms: q(0.5, 0.6), total_ms: q(1202, 0.6) };
    }
    if (k === "semantic-hit") {
      return { ...gate, embed_ms: q(4.9, 0.8), search_ms: q(0.38, 0.5), upstream_send_ms: null, ttft_ms: q(0.42, 0.4), decode_ms: q(2.2, 0.5),
        downstream_ms: q(0.3, 0.4), total_ms: q(8.4, 0.5) };
    }
    if (k === "coalesced") {
      return { ...gate, embed_ms: null, search_ms: null, upstream_send_ms: null, ttft_ms: q(214, 0.9), decode_ms: q(640, 0.6),
        downstream_ms: q(0.4, 0.5), total_ms: q(856, 0.6) };
    }
    return { ...gate, embed_ms: null, search_ms: null, upstream_send_ms: null, ttft_ms: q(0.36, 0.4), decode_ms: q(2.0, 0.5),
      downstream_ms: q(0.28, 0.4), total_ms: q(2.8, 0.5) };
  };
  const byOutcome = {};
  for (const k of OUTCOMES) if (req[k]) byOutcome[k] = { count: req[k], phases: phasesFor(k) };

  const hitsServed = req.hit + req["semantic-hit"] + req.coalesced;
  const perHit = hitsServed ? 405.3 : null;
  const stats = {
    object: "reprise.stats",
    version: "0.1.0",
    uptime_s: empty ? 4.2 : 1834.6,
    mode: semantic ? "semantic" : "exact-only",
    store: { entries: entries.length, bytes: entries.reduce((a, e) => a + e.bytes, 0) },
    index: semantic ? { vectors: entries.length, tombstones: empty ? 0 : 2, rebuilding: false } : null,
    requests: req,
    rates: {
      hit: rate(req.hit + req["semantic-hit"] + req.coalesced), "exact-hit": rate(req.hit), "semantic-hit": rate(req["semantic-hit"]),
      coalesced: rate(req.coalesced), miss: rate(req.miss), bypass: rate(req.bypass),
    },
    ttft_saved_ms: { total: hitsServed ? perHit * hitsServed : 0, per_hit: perHit, hits: hitsServed },
    embedding: semantic
      ? { fallbacks: empty ? 0 : 2, batches: empty ? 0 : 311, texts: empty ? 0 : 402, mean_batch_size: empty ? null : 1.29, p50_ms: empty ? null : 4.8, p99_ms: empty ? null : 11.6 }
      : { fallbacks: 0, batches: 0, texts: 0, mean_batch_size: null, p50_ms: null, p99_ms: null },
    upstream_errors: { connect: 0, timeout: 0, protocol: 0, status: empty ? 0 : 1, stream: 0 },
    guard_refusals: {
      numbers: empty ? 0 : 7, negation: empty ? 0 : 3, format: 0, task: empty ? 0 : 1,
      direction: empty ? 0 : 2, antonym: empty ? 0 : 4, entity: empty ? 0 : 5, template: empty ? 0 : 1,
    },
    latency: { window: 1000, by_outcome: byOutcome },
    ttft_histogram: { bounds_ms: BOUNDS, by_outcome: by },
    timeline: { bucket_s: bucketS, buckets },
  };

  const requests = [];
  if (!empty) {
    const kinds = ["miss", "hit", "semantic-hit", "hit", "miss", "coalesced", "hit", "bypass", "pass"].filter((k) => semantic || k !== "semantic-hit");
    for (let i = 0; i < 60; i++) {
      const cache = kinds[i % kinds.length];
      const e = entries[i % Math.max(1, entries.length)];
      const miss = cache === "miss" || cache === "bypass";
      const ttft = miss ? 200 + rand() * 600 : cache === "coalesced" ? 100 + rand() * 300 : 0.3 + rand() * (cache === "semantic-hit" ? 6 : 0.4);
      const decode = miss || cache === "coalesced" ? 300 + rand() * 900 : 1.5 + rand();
      requests.push({
        id: "req_" + (0x9000 - i).toString(16), started_at_ms: now - i * 4100, method: "POST",
        route: cache === "pass" ? "/v1/models" : "/v1/chat/completions", model: cache === "pass" ? null : e.model,
        stream: i % 2 === 0, status: i === 13 ? 503 : 200, cache, completion: "complete",
        phases: { ingress_ms: 0.1, lookup_ms: 0.25, embed_ms: null, search_ms: null, upstream_send_ms: miss ? 1.2 : null, ttft_ms: cache === "pass" ? null : ttft,
          decode_ms: cache === "pass" ? null : decode, downstream_ms: 0.4, total_ms: (cache === "pass" ? 3 : ttft + decode + 2), tokens: 42, completion_tokens: 42,
          itl_p50_ms: null, itl_p99_ms: null, tokens_per_s: null },
        entry: cache === "pass" || cache === "bypass" ? null : e.id,
        similarity: cache === "semantic-hit" ? 0.94 : null,
        nearest: cache === "miss" ? (i === 0 ? 0.9426 : 0.7113) : null,
        guard: cache === "miss" && i === 0 ? "numbers" : null,
        ttft_saved_ms: cache.includes("hit") ? 400 - ttft : null,
      });
    }
  }
  // Shadow decisions (semantic mode only): one would-hit, one refused by a running guard with another
  // guard that is off but would refuse too, one below the threshold.
  const guards = (refusing, off = []) => ["numbers", "negation", "format", "task", "direction", "antonym", "entity", "template"]
    .map((guard) => ({ guard, enabled: !off.includes(guard), refuses: refusing.includes(guard) }));
  const shadow = semantic && !empty ? [
    { id: 3, at_ms: now - 2000, request_id: "req_s3", namespace: "support", model: "gpt-4o-mini", prompt: "Can I cancel my order before it ships?",
      would: "would-refuse", entry: entries[0].id, entry_prompt: "Can I cancel my order after it ships?", similarity: 0.9896, threshold: 0.9,
      guards: guards(["direction", "antonym"], ["antonym"]) },
    { id: 2, at_ms: now - 5000, request_id: "req_s2", namespace: "support", model: "gpt-4o-mini", prompt: "I forgot my password, how can I reset it",
      would: "would-hit", entry: entries[1].id, entry_prompt: "How do I reset my password?", similarity: 0.9412, threshold: 0.9, guards: guards([]), verdict: "same" },
    { id: 1, at_ms: now - 9000, request_id: "req_s1", namespace: null, model: "gpt-4o-mini", prompt: "What is a good name for a cat?",
      would: "would-miss", entry: entries[2].id, entry_prompt: "Why is the sky blue?", similarity: 0.31, threshold: 0.9, guards: guards([]) },
  ] : [];
  stats.feedback = { right: 0, wrong: 0, vetoes: 0, approvals: 0 };
  if (semantic && !empty) {
    stats.judge = { calls: 41, same: 30, different: 9, unsure: 2, timeouts: 1, failures: 0, over_budget: 3, too_long: 0,
      queued: 0, dropped: 0, queue_depth: 0, prompt_tokens: 5120, completion_tokens: 164, p50_ms: 182.4, p99_ms: 611.0,
      namespaces: [{ namespace: "support", observations: 39, wrong: 9, wrong_rate: 9 / 39 }] };
  }
  return { stats, entries, requests, shadow, feedback: [] };
}

function publicSummary(e) {
  const out = {};
  for (const [k, v] of Object.entries(e)) if (!k.startsWith("_")) out[k] = v;
  return out;
}

function sendJson(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
function error(res, status, type, code, message, param = null) {
  sendJson(res, status, { error: { message, type, param, code } });
}

/**
 * Starts the mock on a free port. `mode`: "semantic" | "exact-only" | "empty"; `entries`: how many entries.
 * Returns { url, token, data, log, close }; tests may change `data` to simulate new traffic.
 */
export async function startMock({ token = "mock-token", mode = "semantic", port = 0, entries } = {}) {
  const data = buildData(mode, Date.now(), entries);
  const log = { deletes: [], searches: [], verdicts: [] };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://mock");
    const path = url.pathname;
    if (req.method === "GET" && path === "/admin/ui") {
      // Read on every request so edits to the HTML show up on reload during development.
      const html = readFileSync(HTML_PATH);
      res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" });
      res.end(html);
      return;
    }
    if (!path.startsWith("/admin/")) return error(res, 404, "invalid_request_error", "not_found", `No route ${path}.`);
    if (req.headers.authorization !== `Bearer ${token}`) {
      return error(res, 401, "authentication_error", "invalid_admin_token", "Missing or invalid admin token. Send `Authorization: Bearer <admin token>`.");
    }
    if (req.method === "GET" && path === "/admin/stats") {
      data.stats.store.entries = data.entries.length;
      data.stats.store.bytes = data.entries.reduce((a, e) => a + e.bytes, 0);
      if (data.stats.index) data.stats.index.vectors = data.entries.length;
      return sendJson(res, 200, data.stats);
    }
    if (req.method === "GET" && path === "/admin/requests") {
      const limit = Number(url.searchParams.get("limit") ?? 100);
      return sendJson(res, 200, { object: "list", data: data.requests.slice(0, limit) });
    }
    if (req.method === "GET" && path === "/admin/shadow") {
      const limit = Number(url.searchParams.get("limit") ?? 50);
      return sendJson(res, 200, { object: "list", data: data.shadow.slice(0, limit), has_more: false, next_cursor: null });
    }
    if (req.method === "GET" && path === "/admin/feedback") {
      return sendJson(res, 200, { object: "list", data: data.feedback, has_more: false, next_cursor: null });
    }
    if (req.method === "POST" && path === "/admin/feedback") {
      let raw = "";
      req.on("data", (c) => { raw += c; });
      req.on("end", () => {
        const body = JSON.parse(raw || "{}");
        const d = data.shadow.find((x) => x.request_id === body.request_id);
        if (!d) return error(res, 404, "invalid_request_error", "request_not_found", `No recent request ${body.request_id}.`, "request_id");
        log.verdicts.push([body.request_id, body.verdict]);
        data.stats.feedback[body.verdict] += 1;
        const record = { id: data.feedback.length + 1, at_ms: Date.now(), request_id: d.request_id, verdict: body.verdict, met: "shadow",
          entry: d.entry, prompt: d.prompt, similarity: d.similarity, effect: body.verdict === "wrong" ? "vetoed; entry threshold 0.9897" : "approved alias" };
        data.feedback.unshift(record);
        sendJson(res, 200, record);
      });
      return;
    }
    if (req.method === "GET" && path === "/admin/entries") {
      const limitRaw = url.searchParams.get("limit");
      const limit = limitRaw === null ? 20 : Number(limitRaw);
      if (!Number.isInteger(limit) || limit < 1 || limit > 200) return error(res, 400, "invalid_request_error", "invalid_value", "limit must be 1..=200.", "limit");
      let list = data.entries;
      for (const f of ["namespace", "model"]) {
        const v = url.searchParams.get(f);
        if (v) list = list.filter((e) => e[f] === v);
      }
      const q = url.searchParams.get("q");
      if (q) {
        log.searches.push(q);
        if (data.stats.mode === "exact-only") return error(res, 400, "invalid_request_error", "semantic_disabled", "Semantic search needs semantic mode.", "q");
        const scored = list.map((e) => ({ ...publicSummary(e), similarity: Math.round(similarity(q, e.prompt) * 1000) / 1000 }))
          .filter((e) => e.similarity > 0)
          .sort((a, b) => b.similarity - a.similarity)
          .slice(0, limit);
        return sendJson(res, 200, { object: "list", data: scored, has_more: false, next_cursor: null });
      }
      const cursor = url.searchParams.get("cursor");
      let start = 0;
      if (cursor) {
        if (!/^e_[0-9a-f]{12}$/.test(cursor)) return error(res, 400, "invalid_request_error", "invalid_value", "Malformed cursor.", "cursor");
        const idx = list.findIndex((e) => e.id === cursor);
        start = idx < 0 ? list.length : idx + 1;
      }
      const page = list.slice(start, start + limit);
      const hasMore = start + limit < list.length;
      return sendJson(res, 200, { object: "list", data: page.map(publicSummary), has_more: hasMore, next_cursor: hasMore ? page[page.length - 1].id : null });
    }
    const m = /^\/admin\/entries\/([^/]+)$/.exec(path);
    if (m) {
      const id = decodeURIComponent(m[1]);
      if (!/^e_[0-9a-f]{12}$/.test(id)) return error(res, 400, "invalid_request_error", "invalid_value", "Malformed entry id.", "id");
      const idx = data.entries.findIndex((e) => e.id === id);
      if (idx < 0) return error(res, 404, "invalid_request_error", "entry_not_found", `No entry ${id}.`, "id");
      const e = data.entries[idx];
      if (req.method === "DELETE") {
        data.entries.splice(idx, 1);
        log.deletes.push(id);
        return sendJson(res, 200, { id, object: "reprise.entry.deleted", deleted: true });
      }
      if (req.method === "GET") {
        return sendJson(res, 200, {
          ...publicSummary(e), key: "ab".repeat(32), partition: "cd".repeat(32), answer: e._answer,
          body: { id: "chatcmpl-mock", object: "chat.completion", model: e.model, choices: [{ index: 0, message: { role: "assistant", content: e._answer }, finish_reason: "stop" }] },
          events: e.tokens + 2, usage: null, phases: e._phases, has_vector: data.stats.mode !== "exact-only", hit_history: e._history,
        });
      }
    }
    return error(res, 404, "invalid_request_error", "not_found", `No route ${req.method} ${path}.`);
  });
  await new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
  const { port: bound } = server.address();
  return {
    url: `http://127.0.0.1:${bound}`,
    token,
    data,
    log,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const mock = await startMock({ mode: process.argv[2] ?? "semantic", port: Number(process.argv[3] ?? 0) });
  console.log(`${mock.url}/admin/ui#token=${mock.token}`);
}
