//! `reprise_client::eval` against a small fake gateway that speaks the cache headers: checks the
//! per-pair protocol (store `a`, wait until it is visible, look up `b` without storing it) and how
//! outcomes, similarities and failures are recorded. The fake makes stored entries visible only
//! after a delay, like the gateway's background writer, and plays a sync verify stage for prompts
//! that say `judge=VERDICT` (its headers, its `Server-Timing` entry, its delay).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use reprise_client::eval::pairs::{self, Ambiguous};
use reprise_client::eval::{self, report, EvalConfig, EvalError};
use serde_json::{json, Value};

const VISIBLE_AFTER: Duration = Duration::from_millis(30);

#[derive(Default)]
struct Fake {
    /// (namespace, context) -> (final user text, stored at).
    entries: HashMap<(String, String), (String, Instant)>,
    stores: usize,
    requests: usize,
}

#[derive(Clone)]
struct Gateway {
    fake: Arc<Mutex<Fake>>,
    semantic_ready: bool,
    stores_anything: bool,
}

async fn healthz(State(g): State<Gateway>) -> Json<Value> {
    if g.semantic_ready {
        Json(
            json!({"version": "fake", "semantic": {"status": "ready", "threshold": 0.9, "fallbacks": 0}}),
        )
    } else {
        Json(json!({"semantic": {"status": "disabled", "detail": "no model here"}}))
    }
}

/// Similarity the fake reports for a lookup: `sim=X` written in the looked-up text.
fn similarity_in(text: &str) -> f64 {
    text.split("sim=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The verdict a looked-up text asks the fake judge for: `judge=same`, `judge=budget` (served by
/// the error budget, no judge call), …
fn judge_in(text: &str) -> Option<&str> {
    text.split("judge=").nth(1)?.split_whitespace().next()
}

/// The judge's time in the fake: the lookup waits this long, and says so in `Server-Timing`.
const JUDGE_MS: u64 = 40;

async fn chat(State(g): State<Gateway>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let (response, judge_wait) = answer(&g, &headers, &body);
    if judge_wait {
        tokio::time::sleep(Duration::from_millis(JUDGE_MS)).await;
    }
    response
}

/// The fake's answer, and whether it waits for its judge first (the lock is not held meanwhile).
fn answer(g: &Gateway, headers: &HeaderMap, body: &Value) -> (Response, bool) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let (last, context) = messages.split_last().expect("messages");
    let text = last["content"].as_str().expect("fake gateway").to_owned();
    if text.contains("fail500") {
        return (
            (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
            false,
        );
    }
    let namespace = headers["x-reprise-namespace"]
        .to_str()
        .expect("fake gateway")
        .to_owned();
    let no_store = headers
        .get("cache-control")
        .is_some_and(|v| v.to_str().expect("fake gateway").contains("no-store"));
    let key = (
        namespace,
        serde_json::to_string(context).expect("fake gateway"),
    );
    let mut fake = g.fake.lock().expect("lock");
    fake.requests += 1;
    let found = fake.entries.get(&key).cloned();
    let mut response =
        Json(json!({"choices": [{"message": {"role": "assistant", "content": "ok"}}]}))
            .into_response();
    let h = response.headers_mut();
    let mut judge_wait = false;
    match found {
        Some((stored, at)) if at.elapsed() >= VISIBLE_AFTER => {
            if stored == text {
                h.insert("x-reprise-cache", "hit".parse().expect("header value"));
            } else if let Some(verdict) = judge_in(&text) {
                let sim = similarity_in(&text);
                let served = matches!(verdict, "same" | "budget");
                let name = if served {
                    "x-reprise-similarity"
                } else {
                    "x-reprise-nearest"
                };
                let outcome = if served { "semantic-hit" } else { "miss" };
                h.insert("x-reprise-cache", outcome.parse().expect("header value"));
                h.insert(name, format!("{sim:.4}").parse().expect("header value"));
                if verdict == "budget" {
                    h.insert(
                        "x-reprise-verified",
                        "budget".parse().expect("header value"),
                    );
                } else {
                    h.insert("x-reprise-verify", verdict.parse().expect("header value"));
                    h.append(
                        "server-timing",
                        "lookup;dur=0.3".parse().expect("header value"),
                    );
                    h.append(
                        "server-timing",
                        format!("judge;dur={JUDGE_MS}, total;dur=41")
                            .parse()
                            .expect("header value"),
                    );
                    if served {
                        h.insert("x-reprise-verified", "judge".parse().expect("header value"));
                    }
                    judge_wait = true;
                }
            } else {
                let sim = similarity_in(&text);
                let name = if sim >= 0.9 {
                    "x-reprise-similarity"
                } else {
                    "x-reprise-nearest"
                };
                let outcome = if sim >= 0.9 { "semantic-hit" } else { "miss" };
                h.insert("x-reprise-cache", outcome.parse().expect("header value"));
                h.insert(name, format!("{sim:.4}").parse().expect("header value"));
            }
        }
        _ => {
            h.insert("x-reprise-cache", "miss".parse().expect("header value"));
            if !no_store && g.stores_anything {
                fake.stores += 1;
                fake.entries.insert(key, (text, Instant::now()));
            }
        }
    }
    (response, judge_wait)
}

async fn start(semantic_ready: bool, stores_anything: bool) -> (String, Arc<Mutex<Fake>>) {
    let fake = Arc::new(Mutex::new(Fake::default()));
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/v1/chat/completions", post(chat))
        .with_state(Gateway {
            fake: fake.clone(),
            semantic_ready,
            stores_anything,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("fake gateway");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (format!("http://{addr}"), fake)
}

fn config(root: String) -> EvalConfig {
    EvalConfig {
        root,
        api: reprise_client::api::Api::Openai,
        api_key: "sk-test".into(),
        model: "m".into(),
        concurrency: 3,
        run_id: "test".into(),
        store_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(10),
    }
}

const PAIRS: &str = r#"{"id":"exact","category":"near_repeat","a":"What is Rust?","b":"What is Rust?","same_answer":true}
{"id":"para","category":"paraphrase","a":"How tall is Everest?","b":"Everest height? sim=0.93","same_answer":true}
{"id":"para-low","category":"paraphrase","a":"Best pizza dough?","b":"How to make pizza base sim=0.8","same_answer":true}
{"id":"trap-high","category":"negation","a":"Is it safe?","b":"Is it unsafe? sim=0.95","same_answer":false}
{"id":"trap-low","category":"negation","a":"Open on Sunday?","b":"Closed on Sunday? sim=0.5","same_answer":false}
{"id":"conv","category":"context_swap","same_answer":false,"a":[{"role":"user","content":"I pay for Flixora"},{"role":"assistant","content":"ok"},{"role":"user","content":"cancel it"}],"b":[{"role":"user","content":"I pay for a gym"},{"role":"assistant","content":"ok"},{"role":"user","content":"cancel it"}]}
{"id":"broken","category":"paraphrase","a":"fine","b":"fail500","same_answer":true}
"#;

#[tokio::test]
async fn each_pair_stores_a_waits_for_it_and_looks_up_b_without_storing() {
    let (root, fake) = start(true, true).await;
    let pairs = pairs::parse("fixture.jsonl", PAIRS, Ambiguous::Different).expect("valid pairs");
    let n = pairs.len();
    let evaluation = eval::run(
        &config(eval::root_url(&format!("{root}/v1"))),
        pairs,
        |_| {},
    )
    .await
    .expect("fake gateway");
    assert_eq!(evaluation.gateway.threshold, 0.9);
    let got: Vec<(&str, &str, Option<f64>, bool)> = evaluation
        .results
        .iter()
        .map(|r| (r.id.as_str(), r.outcome.as_str(), r.similarity, r.served))
        .collect();
    assert_eq!(
        got,
        vec![
            ("exact", "hit", Some(1.0), true),
            ("para", "semantic-hit", Some(0.93), true),
            ("para-low", "miss", Some(0.8), false),
            ("trap-high", "semantic-hit", Some(0.95), true),
            ("trap-low", "miss", Some(0.5), false),
            // Different earlier turns: a different partition, no candidate.
            ("conv", "miss", None, false),
            ("broken", "error", None, false),
        ]
    );
    let broken = &evaluation.results[6];
    assert!(
        broken
            .error
            .as_deref()
            .expect("fake gateway")
            .starts_with("looking up b: HTTP 500"),
        "{broken:?}"
    );
    let fake = fake.lock().expect("lock");
    // Only each pair's first `a` was stored; the checks and every `b` were sent with no-store.
    assert_eq!(fake.stores, n);
    // `a` only becomes visible after a delay: the client had to ask more than once per pair.
    assert!(fake.requests > 3 * n, "{} requests", fake.requests);
    drop(fake);

    let summary = report::summarize(&evaluation, "fixture");
    assert_eq!(summary.overall.pairs, 6);
    assert_eq!(summary.overall.errors, 1);
    assert_eq!(summary.overall.hit_share(), Some(2.0 / 3.0));
    assert_eq!(summary.overall.trap_share(), Some(1.0 / 3.0));
    assert_eq!(summary.overall.no_candidate, 1);
    // Under 1% wrong, the 0.95 trap must go: only thresholds above it, i.e. the exact hit, remain.
    let best = summary.best[0].1.expect("fake gateway");
    assert_eq!((best.threshold, best.hit_share), (1.0, 1.0 / 3.0));
}

/// Pairs through a gateway that judges: what each lookup said of the verify stage is recorded, and
/// the report's verify figures come from it.
#[tokio::test]
async fn verify_headers_and_the_time_to_the_head_are_recorded_per_pair() {
    let (root, _) = start(true, true).await;
    let text = concat!(
        r#"{"id":"vetted","category":"paraphrase","a":"Reset my password","b":"How do I reset my password sim=0.86 judge=same","same_answer":true}"#,
        "\n",
        r#"{"id":"caught","category":"negation","a":"Is it safe?","b":"Is it unsafe? sim=0.91 judge=different","same_answer":false}"#,
        "\n",
        r#"{"id":"budget","category":"paraphrase","a":"Open hours?","b":"When are you open sim=0.95 judge=budget","same_answer":true}"#,
        "\n",
        r#"{"id":"plain","category":"paraphrase","a":"Tallest peak?","b":"Highest mountain? sim=0.93","same_answer":true}"#,
        "\n",
    );
    let pairs = pairs::parse("verify.jsonl", text, Ambiguous::Different).expect("valid pairs");
    let evaluation = eval::run(&config(root), pairs, |_| {})
        .await
        .expect("fake gateway");
    /// id, served, `x-reprise-verified`, `x-reprise-verify`, the judge's ms.
    type Seen<'a> = (&'a str, bool, Option<&'a str>, Option<&'a str>, Option<f64>);
    let got: Vec<Seen> = evaluation
        .results
        .iter()
        .map(|r| {
            (
                r.id.as_str(),
                r.served,
                r.verified.as_deref(),
                r.verify.as_deref(),
                r.judge_ms,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("vetted", true, Some("judge"), Some("same"), Some(40.0)),
            ("caught", false, None, Some("different"), Some(40.0)),
            ("budget", true, Some("budget"), None, None),
            ("plain", true, None, None, None),
        ]
    );
    // The time to the head covers the judge's wait on the lookups it was asked.
    let ttft = |i: usize| evaluation.results[i].ttft_ms.expect("timed");
    assert!(ttft(0) >= JUDGE_MS as f64 && ttft(1) >= JUDGE_MS as f64);

    let summary = report::summarize(&evaluation, "verify");
    let v = summary.verify.as_ref().expect("judge activity");
    assert_eq!((v.overall.judge_calls, v.overall.lookups), (2, 4));
    assert_eq!(
        (v.overall.verified_by_judge, v.overall.verified_by_budget),
        (1, 1)
    );
    assert_eq!(v.overall.verified_hit_ttft.n, 1);
    assert_eq!(v.overall.unverified_hit_ttft.n, 2);
    let line = serde_json::to_value(&evaluation.results[0]).expect("json");
    assert_eq!(line["verify"], "same");
    assert_eq!(line["judge_ms"], 40.0);
}

#[tokio::test]
async fn a_gateway_without_semantic_matching_is_refused() {
    let (root, _) = start(false, true).await;
    let pairs = pairs::parse("f", PAIRS, Ambiguous::Different).expect("valid pairs");
    let err = eval::run(&config(root), pairs, |_| {})
        .await
        .expect_err("an error");
    assert!(
        matches!(err, EvalError::SemanticDisabled { ref detail } if detail == "no model here"),
        "{err}"
    );
}

#[tokio::test]
async fn an_entry_that_never_appears_is_an_error_for_its_pair() {
    let (root, _) = start(true, false).await;
    let pairs = pairs::parse("f", PAIRS, Ambiguous::Different).expect("valid pairs");
    let mut config = config(root);
    config.store_timeout = Duration::from_millis(100);
    let evaluation = eval::run(&config, pairs[..2].to_vec(), |_| {})
        .await
        .expect("fake gateway");
    for r in &evaluation.results {
        let err = r.error.as_deref().expect("fake gateway");
        assert!(err.starts_with("a was not stored within 0.1 s"), "{err}");
    }
}

#[test]
fn the_committed_fixture_parses_with_both_kinds_of_pairs() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/eval-pairs.jsonl");
    let pairs = pairs::read_file(&path, Ambiguous::Different).expect("valid pairs");
    assert!(pairs.len() >= 8);
    assert!(pairs.iter().any(|p| p.same_answer));
    assert!(pairs.iter().any(|p| !p.same_answer));
    assert!(pairs
        .iter()
        .any(|p| matches!(p.a, reprise_client::eval::pairs::Prompt::Messages(_))));
}
