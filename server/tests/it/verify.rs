//! The verify stage end to end: a gateway whose embedder places prompts at chosen similarities (so
//! each case sits exactly where it must relative to the floor and the threshold), in front of
//! `reprise-sim`, asking a judge server of the test's that records every call. Sync verdicts are
//! served or refused and remembered; a timeout is a miss; async verdicts serve the next request;
//! the error budget stops judging where its verdicts bound the wrong rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use reprise_server::config::{Config, Secret};
use reprise_server::embed::{EmbedConfig, EmbedModel, Embedder};
use reprise_server::entry::{Entry, EntryId, HitEvent, Replay};
use reprise_server::key::CacheKey;
use reprise_server::store::{Store, StoreError, Upkeep};
use reprise_server::verify::settings::{VerifyKind, VerifyMode};
use reprise_server::AppState;
use serde_json::{json, Value};

use crate::common::*;

/// The prompt every case is compared with.
const BASE: &str = "how do I reset my password";

/// A model that puts `BASE` at (1, 0, 0) and each known prompt at its given cosine to it; any
/// other text is orthogonal to both.
struct Placed(HashMap<String, f32>);

impl EmbedModel for Placed {
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        Ok(texts
            .iter()
            .map(|t| match self.0.get(t.as_str()) {
                Some(s) => vec![*s, (1.0 - s * s).max(0.0).sqrt(), 0.0],
                None => vec![0.0, 0.0, 1.0],
            })
            .collect())
    }

    fn dimension(&self) -> usize {
        3
    }
}

/// What the judge received and how it answers.
#[derive(Default)]
struct JudgeLog {
    calls: Vec<(HeaderMap, Value)>,
    /// `new` prompt → verdict; others are `different`.
    verdicts: HashMap<String, &'static str>,
    delay_ms: u64,
}

type Shared = Arc<Mutex<JudgeLog>>;

async fn judge_answer(
    State(log): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let user = body["messages"][1]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let block: Value = user
        .strip_prefix("```json\n")
        .and_then(|t| t.strip_suffix("\n```"))
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null);
    let (verdict, delay) = {
        let mut log = log.lock().expect("log");
        log.calls.push((headers, body));
        let new = block["new"].as_str().unwrap_or_default();
        (
            log.verdicts.get(new).copied().unwrap_or("different"),
            log.delay_ms,
        )
    };
    tokio::time::sleep(Duration::from_millis(delay)).await;
    Json(json!({
        "id": "chatcmpl-judge", "object": "chat.completion", "created": 0, "model": "judge",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": format!("{{\"verdict\":\"{verdict}\"}}")}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 4, "total_tokens": 124}
    }))
}

/// A judge server on an ephemeral port: its base URL and its log.
async fn judge_server() -> (String, Shared) {
    let log = Shared::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(judge_answer))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, log)
}

/// A gateway with verify on, the placed prompts, no guards (the texts are the test's, the guards
/// have their own tests), threshold 0.95, floor 0.80.
async fn gateway(
    upstream: String,
    judge_url: &str,
    placed: &[(&str, f32)],
    tune: impl FnOnce(&mut Config),
) -> Gateway {
    let mut config = config_for(upstream);
    config.live.similarity_threshold = 0.95;
    config.live.semantic_guards = "none".parse().expect("guards");
    config.live.verify = VerifyKind::Judge;
    config.live.verify_floor = 0.80;
    config.live.judge_model = Some("judge-model".into());
    config.live.judge_url = Some(judge_url.to_owned());
    config.judge_api_key = Some(Secret::new("sk-judge"));
    tune(&mut config);
    config.validate().expect("valid config");
    let mut table: HashMap<String, f32> =
        placed.iter().map(|(t, s)| ((*t).to_owned(), *s)).collect();
    table.insert(BASE.to_owned(), 1.0);
    start_with(config, move |config| {
        let embedder = Embedder::with_model(Box::new(Placed(table)), &EmbedConfig::default())
            .expect("embedder");
        AppState::with_embedder(config, Some(Arc::new(embedder))).expect("state")
    })
    .await
}

async fn ask(gw: &Gateway, prompt: &str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client")
        .json(&chat_body(prompt, false))
        .send()
        .await
        .expect("send")
}

/// Stores `BASE`'s answer and waits for its vector in the index.
async fn seed(gw: &Gateway) {
    assert_eq!(outcome(&ask(gw, BASE).await), "miss");
    for _ in 0..500 {
        if gw
            .state
            .semantic
            .as_ref()
            .is_some_and(|s| reprise_server::index::VectorIndex::len(s.index.as_ref()) > 0)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the seeded entry never reached the index");
}

fn calls(log: &Shared) -> usize {
    log.lock().expect("log").calls.len()
}

#[tokio::test]
async fn sync_same_is_served_verified_and_remembered_different_is_refused_for_good() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let (near, wrong, far, close) = (
        "I forgot my password, how can I reset it",
        "how do I reset my username",
        "what is the capital of France",
        "how do i reset my password?",
    );
    let gw = gateway(
        sim.base_url(),
        &judge_url,
        // `far` is not placed: orthogonal to everything.
        &[(near, 0.88), (wrong, 0.90), (close, 0.97)],
        |c| {
            // No budget: the threshold decides what is served unjudged (Krites-style).
            c.live.max_wrong = None;
            // The judge model priced, so its calls are a cost in money.
            c.prices = Some(judge_prices());
        },
    )
    .await;
    log.lock()
        .expect("log")
        .verdicts
        .insert(near.to_owned(), "same");
    seed(&gw).await;
    let upstream_before = upstream_calls(&sim);

    // Between the floor and the threshold: judged, `same`, served.
    let hit = ask(&gw, near).await;
    assert_eq!(outcome(&hit), "semantic-hit");
    assert_eq!(header(&hit, "x-reprise-verified").as_deref(), Some("judge"));
    assert_eq!(header(&hit, "x-reprise-verify").as_deref(), Some("same"));
    let timing = header(&hit, "server-timing").expect("timing");
    assert!(timing.contains("judge;dur="), "{timing}");
    assert_eq!(calls(&log), 1);
    {
        let log = log.lock().expect("log");
        let (headers, body) = &log.calls[0];
        // The judge's own key; the client's never goes to another host.
        assert_eq!(headers["authorization"], "Bearer sk-judge");
        assert_eq!(body["model"], "judge-model");
        assert_eq!(body["temperature"], 0);
        let user = body["messages"][1]["content"].as_str().expect("user");
        let block: Value = serde_json::from_str(
            user.trim_start_matches("```json\n")
                .trim_end_matches("\n```"),
        )
        .expect("block");
        assert_eq!(block["cached"], BASE);
        assert_eq!(block["new"], near);
    }
    // Asked again: served from the verdict, no second call.
    let again = ask(&gw, near).await;
    assert_eq!(outcome(&again), "semantic-hit");
    assert_eq!(
        header(&again, "x-reprise-verified").as_deref(),
        Some("judge")
    );
    assert_eq!(calls(&log), 1);

    // `different`: a miss, and never judged or served again.
    let miss = ask(&gw, wrong).await;
    assert_eq!(outcome(&miss), "miss");
    assert_eq!(
        header(&miss, "x-reprise-verify").as_deref(),
        Some("different")
    );
    assert_eq!(calls(&log), 2);
    // The miss stored its own answer: once the writer has it, the same prompt is an exact hit.
    wait_for_entries(&gw, 2).await;
    let again = ask(&gw, wrong).await;
    assert_eq!(
        outcome(&again),
        "hit",
        "its own answer was stored by the miss"
    );

    // Below the floor: no call. Above the threshold (no budget): served unjudged, as without verify.
    assert_eq!(outcome(&ask(&gw, far).await), "miss");
    let above = ask(&gw, close).await;
    assert_eq!(outcome(&above), "semantic-hit");
    assert_eq!(header(&above, "x-reprise-verified"), None);
    assert_eq!(calls(&log), 2);
    // Upstream: the wrong pair's miss and the far one's.
    assert_eq!(upstream_calls(&sim) - upstream_before, 2);

    let stats: Value = admin_json(&gw, "/admin/stats").await;
    let judge = &stats["judge"];
    assert_eq!(
        (
            judge["calls"].as_u64(),
            judge["same"].as_u64(),
            judge["different"].as_u64()
        ),
        (Some(2), Some(1), Some(1)),
        "{judge}"
    );
    assert_eq!(judge["prompt_tokens"], 240);
    assert_eq!(judge["namespaces"][0]["observations"], 2);
    // The judge's calls are a cost against what hits saved, at the judge model's price.
    let savings = &stats["savings"];
    let cost = &savings["judge"];
    assert_eq!(
        (
            cost["calls"].as_u64(),
            cost["input_tokens"].as_u64(),
            cost["output_tokens"].as_u64()
        ),
        (Some(2), Some(240), Some(8)),
        "{cost}"
    );
    let judge_usd = (240.0 * 10.0 + 8.0 * 20.0) / 1e6;
    assert!(
        (cost["cost_usd"].as_f64().expect("usd") - judge_usd).abs() < 1e-12,
        "{cost}"
    );
    let saved = savings["total"]["cost_usd"].as_f64().expect("saved");
    assert!((savings["net_cost_usd"].as_f64().expect("net") - (saved - judge_usd)).abs() < 1e-12);
    let text = metrics(&gw).await;
    assert!(
        text.contains("reprise_judge_calls_total{verdict=\"same\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("reprise_judge_duration_seconds_count 2"),
        "{text}"
    );
    assert!(
        text.contains("reprise_error_budget_observations{verdict=\"wrong\"} 1"),
        "{text}"
    );
    assert!(text.contains("reprise_judge_queue_depth 0"), "{text}");
    let judge_metric: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("reprise_judge_cost_total "))
        .and_then(|v| v.parse().ok())
        .expect("reprise_judge_cost_total");
    assert!((judge_metric - judge_usd).abs() < 1e-12, "{judge_metric}");
    // Two clean verdicts: no judge error (the series exist from the start, for the alert's rate).
    assert!(
        text.contains("reprise_judge_errors_total{kind=\"timeout\"} 0"),
        "{text}"
    );
}

/// A price table that prices the test judge's model at 10 and 20 USD per million tokens.
fn judge_prices() -> std::path::PathBuf {
    let dir = tempfile::tempdir().expect("dir").keep();
    let path = dir.join("prices.toml");
    std::fs::write(
        &path,
        "[models]\n\"judge-model\" = { input = 10.0, output = 20.0 }\n",
    )
    .expect("write");
    path
}

#[tokio::test]
async fn a_judge_that_does_not_answer_in_time_is_a_miss_not_a_hang() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let near = "I forgot my password, how can I reset it";
    let gw = gateway(sim.base_url(), &judge_url, &[(near, 0.88)], |c| {
        c.live.judge_timeout_ms = 150
    })
    .await;
    {
        let mut log = log.lock().expect("log");
        log.verdicts.insert(near.to_owned(), "same");
        log.delay_ms = 3_000;
    }
    seed(&gw).await;
    let started = std::time::Instant::now();
    let miss = ask(&gw, near).await;
    assert_eq!(outcome(&miss), "miss");
    assert_eq!(
        header(&miss, "x-reprise-verify").as_deref(),
        Some("unsure; reason=timeout")
    );
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        started.elapsed()
    );
    // The alerting rule `RepriseJudgeErrors` reads this counter.
    let text = metrics(&gw).await;
    assert!(
        text.contains("reprise_judge_errors_total{kind=\"timeout\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("reprise_judge_errors_total{kind=\"failed\"} 0"),
        "{text}"
    );
}

#[tokio::test]
async fn async_verdicts_serve_the_next_request_and_add_no_wait_to_the_miss() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let near = "I forgot my password, how can I reset it";
    let gw = gateway(sim.base_url(), &judge_url, &[(near, 0.88)], |c| {
        c.live.verify_mode = VerifyMode::Async
    })
    .await;
    {
        let mut log = log.lock().expect("log");
        log.verdicts.insert(near.to_owned(), "same");
        // Slower than the upstream: a miss that waited for it would show.
        log.delay_ms = 400;
    }
    seed(&gw).await;
    let started = std::time::Instant::now();
    let miss = ask(&gw, near).await;
    let took = started.elapsed();
    assert_eq!(outcome(&miss), "miss");
    assert_eq!(header(&miss, "x-reprise-verify").as_deref(), Some("queued"));
    assert!(
        took < Duration::from_millis(400),
        "the miss waited for the judge: {took:?}"
    );
    // The verdict lands in the background.
    for _ in 0..300 {
        // The call is counted before its verdict is written: wait for the approval itself.
        if gw.state.verifier.judge.counts.calls() == 1 && gw.state.feedback.counts().approvals == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(calls(&log), 1);
    // The miss stored the paraphrase's own answer: a fresh paraphrase is needed to see the alias,
    // so ask one the exact key cannot answer but the approval can (same words, other spacing).
    let respaced = "I forgot my password,  how can I reset it";
    let hit = ask(&gw, respaced).await;
    assert_eq!(
        outcome(&hit),
        "semantic-hit",
        "the approved alias serves the next request"
    );
    assert_eq!(header(&hit, "x-reprise-verified").as_deref(), Some("judge"));
    assert_eq!(calls(&log), 1);
}

#[tokio::test]
async fn under_a_budget_judge_calls_stop_where_the_verdicts_bound_the_wrong_rate() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    // 70 distinct prompts at the same similarity: with max_wrong 0.05 the bound clears after 59
    // right verdicts (0 of 59 at 95%: 0.0495).
    let prompts: Vec<String> = (0..70)
        .map(|i| format!("password reset question variant {}", "x".repeat(i + 1)))
        .collect();
    let placed: Vec<(&str, f32)> = prompts.iter().map(|p| (p.as_str(), 0.90)).collect();
    let gw = gateway(sim.base_url(), &judge_url, &placed, |c| {
        c.live.max_wrong = Some(0.05);
        // No rate budget: this test sends its lookups as fast as it can.
        c.judge_rate = 0.0;
    })
    .await;
    {
        let mut log = log.lock().expect("log");
        for p in &prompts {
            log.verdicts.insert(p.clone(), "same");
        }
    }
    seed(&gw).await;
    let mut verified = Vec::new();
    for p in &prompts {
        let r = ask(&gw, p).await;
        assert_eq!(outcome(&r), "semantic-hit", "{p}");
        verified.push(header(&r, "x-reprise-verified").unwrap_or_default());
    }
    let judged = verified.iter().filter(|v| *v == "judge").count();
    let budget = verified.iter().filter(|v| *v == "budget").count();
    // The first 59 are judged; after them, all but the explored few (2%) are served on the bound.
    assert!(verified[..59].iter().all(|v| v == "judge"), "{verified:?}");
    assert!(budget >= 8, "{verified:?}");
    assert_eq!(judged + budget, 70);
    assert_eq!(calls(&log), judged);
}

#[tokio::test]
async fn past_the_rate_budget_a_near_match_is_not_judged_and_not_served() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let (first, second) = (
        "I forgot my password, how can I reset it",
        "password forgotten, how to reset it",
    );
    let gw = gateway(
        sim.base_url(),
        &judge_url,
        &[(first, 0.88), (second, 0.87)],
        |c| c.judge_rate = 1.0,
    )
    .await;
    {
        let mut log = log.lock().expect("log");
        log.verdicts.insert(first.to_owned(), "same");
        log.verdicts.insert(second.to_owned(), "same");
    }
    seed(&gw).await;
    assert_eq!(outcome(&ask(&gw, first).await), "semantic-hit");
    let refused = ask(&gw, second).await;
    assert_eq!(outcome(&refused), "miss");
    assert_eq!(
        header(&refused, "x-reprise-verify").as_deref(),
        Some("unsure; reason=over_budget")
    );
    assert_eq!(calls(&log), 1);
    assert!(metrics(&gw)
        .await
        .contains("reprise_judge_skipped_total{reason=\"over_budget\"} 1"));
}

#[tokio::test]
async fn shadow_mode_judges_in_the_background_and_records_the_verdict_next_to_the_decision() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let near = "I forgot my password, how can I reset it";
    let gw = gateway(sim.base_url(), &judge_url, &[(near, 0.88)], |_| {}).await;
    log.lock()
        .expect("log")
        .verdicts
        .insert(near.to_owned(), "same");
    seed(&gw).await;
    let shadowed = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client")
        .header("x-reprise-cache-mode", "shadow")
        .json(&chat_body(near, false))
        .send()
        .await
        .expect("send");
    assert_eq!(outcome(&shadowed), "miss");
    let shadow = header(&shadowed, "x-reprise-shadow").expect("shadow");
    assert!(shadow.ends_with("; verify=queued"), "{shadow}");
    let mut verdict = Value::Null;
    for _ in 0..300 {
        let page: Value = admin_json(&gw, "/admin/shadow").await;
        verdict = page["data"][0]["verdict"].clone();
        if verdict == "same" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(verdict, "same");
    assert_eq!(calls(&log), 1);
    // `on` now serves the pair from that verdict, without asking again.
    let hit = ask(&gw, "I forgot my password,  how can I reset it").await;
    assert_eq!(outcome(&hit), "semantic-hit");
    assert_eq!(calls(&log), 1);
}

/// A sled store whose exact-key reads miss: what an exact lookup sees when it runs just before
/// its prompt's entry is written, while the search that follows it already finds the entry.
struct BlindExact(reprise_server::store::SledStore);

impl Store for BlindExact {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.0.get(id)
    }

    fn get_by_key(&self, _: &CacheKey) -> Result<Option<Entry>, StoreError> {
        Ok(None)
    }

    fn replay_by_key(&self, _: &CacheKey) -> Result<Option<Replay>, StoreError> {
        Ok(None)
    }

    fn put(&self, entry: Entry) -> Result<EntryId, StoreError> {
        self.0.put(entry)
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        self.0.delete(id)
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        self.0.touch(id, hits, recent)
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.0.set_vector(id, vector)
    }

    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.0.replace_vector(id, vector)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.0.list_newest(before, limit)
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.0.list(after, limit)
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.0.ids()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn bytes(&self) -> u64 {
        self.0.bytes()
    }
}

impl Upkeep for BlindExact {
    fn sweep(
        &self,
        now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        self.0.sweep(now_ms, max_entries, max_bytes)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.0.flush()
    }

    fn clear(&self) -> Result<usize, StoreError> {
        self.0.clear()
    }
}

#[tokio::test]
async fn the_same_prompt_found_by_the_search_is_never_judged() {
    let sim = quick_sim().await;
    let (judge_url, log) = judge_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config_in(sim.base_url(), dir.path().to_owned());
    config.live.semantic_guards = "none".parse().expect("guards");
    config.live.verify = VerifyKind::Judge;
    config.live.judge_model = Some("judge-model".into());
    config.live.judge_url = Some(judge_url.clone());
    config.judge_api_key = Some(Secret::new("sk-judge"));
    config.validate().expect("valid config");
    let table = HashMap::from([(BASE.to_owned(), 1.0_f32)]);
    let gw = start_with(config, move |config| {
        let store = BlindExact(
            reprise_server::store::SledStore::open(&config.data_dir.join("entries"))
                .expect("store"),
        );
        let embedder = Embedder::with_model(Box::new(Placed(table)), &EmbedConfig::default())
            .expect("embedder");
        AppState::with_store_and_embedder(config, Arc::new(store), Some(Arc::new(embedder)))
            .expect("state")
    })
    .await;
    seed(&gw).await;
    let hit = ask(&gw, BASE).await;
    assert_eq!(outcome(&hit), "semantic-hit");
    assert_eq!(header(&hit, "x-reprise-verify"), None);
    assert_eq!(calls(&log), 0);
}
