//! Match-quality evaluation through a running gateway, end to end: for each labeled pair, in a
//! namespace of its own, store `a`, then look up `b` and record whether it was served and with what
//! similarity. The figures (shares served per category, a threshold sweep, the best thresholds under
//! a wrong-answer budget) are computed from those records by [`score`] without further requests.
//!
//! Protocol per pair, all non-streamed chat completions (or Messages API requests, `--api
//! anthropic`: the gateway's cache headers and rules are the same on both routes):
//! 1. `a` is sent normally: a miss, answered upstream and stored by the gateway's writer thread.
//! 2. `a` is sent again with `Cache-Control: no-store` until it reports `hit`, so the entry (and its
//!    vector, which the writer adds to the index right after) is in place before `b` looks for it.
//! 3. `b` is sent with `no-store`: `hit` (similarity 1), `semantic-hit` (`x-reprise-similarity`) or
//!    `miss` (`x-reprise-nearest`, absent when the partition held no candidate;
//!    `x-reprise-nearest-guard` when a literal guard refuses that candidate whatever its similarity,
//!    or `x-reprise-guard` from a gateway older than that header).
//!
//! The namespace (`x-reprise-namespace`) keeps pairs apart, so a pair only ever sees its own `a`.
//!
//! A lookup of `b` that says `x-reprise-semantic: skipped` (the gateway's embedding queue refused it,
//! or it was late, or every scan of a partition awaiting its graph was busy) measured nothing: it is counted and asked again until `store_timeout`. A pair
//! whose lookups were all skipped has the outcome `skipped`: left out of the figures, counted
//! apart, not an error. When `a` itself was stored without a vector, the gateway's backfill embeds
//! it later, so `b` keeps asking for as long.
//!
//! The measured lookup of `b` also records its time to the response head and what a verify stage
//! did ([`verify`]: `x-reprise-verified`, `x-reprise-verify`, the judge's `Server-Timing`).

pub mod calibrate;
pub mod chart;
pub mod cli;
pub mod pairs;
pub mod report;
pub mod score;
pub mod verify;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;

use crate::api::Api;
use pairs::{Pair, Prompt};
use score::Scored;

/// How to reach the gateway and how hard to push it.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    /// The gateway's root URL (without `/v1`).
    pub root: String,
    /// The API the pairs are sent through (both share the gateway's cache rules and headers).
    pub api: Api,
    pub api_key: String,
    pub model: String,
    /// Pairs evaluated at once.
    pub concurrency: usize,
    /// Part of every namespace, so that a run never sees an earlier run's entries.
    pub run_id: String,
    /// How long `a` may take to become visible before the pair counts as an error.
    pub store_timeout: Duration,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

/// The root URL of a gateway given either as its root or as its `/v1` base URL.
pub fn root_url(url: &str) -> String {
    let trimmed = url.trim().trim_end_matches('/');
    trimmed.strip_suffix("/v1").unwrap_or(trimmed).to_owned()
}

/// What `/healthz` says about semantic matching.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GatewayInfo {
    pub version: Option<String>,
    /// The similarity floor a semantic hit needs.
    pub threshold: f64,
    /// The literal guards in use (`numbers,negation`, …, `none`); `None` from gateways without them.
    pub guards: Option<String>,
    pub model_dir: Option<String>,
    /// Embeddings that failed or missed their deadline, turning a request exact-only.
    pub fallbacks: u64,
}

/// Why an evaluation could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot reach the gateway at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("{url} did not answer like a Reprise gateway: {detail}")]
    NotReprise { url: String, detail: String },
    #[error("semantic matching is disabled on the gateway ({detail}); an evaluation would only measure exact matches")]
    SemanticDisabled { detail: String },
}

/// Reads the threshold in use, and checks that semantic matching runs.
pub async fn gateway_info(client: &reqwest::Client, root: &str) -> Result<GatewayInfo, EvalError> {
    let url = format!("{root}/healthz");
    let unreachable = |detail: String| EvalError::Unreachable {
        url: url.clone(),
        detail,
    };
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    if !response.status().is_success() {
        return Err(unreachable(format!("HTTP {}", response.status())));
    }
    let body: Value = response.json().await.map_err(|e| EvalError::NotReprise {
        url: url.clone(),
        detail: format!("/healthz is not JSON: {e}"),
    })?;
    parse_health(&body).map_err(|err| match err {
        HealthError::Disabled(detail) => EvalError::SemanticDisabled { detail },
        HealthError::Shape(detail) => EvalError::NotReprise {
            url: url.clone(),
            detail,
        },
    })
}

enum HealthError {
    Disabled(String),
    Shape(String),
}

fn parse_health(body: &Value) -> Result<GatewayInfo, HealthError> {
    let semantic = body
        .get("semantic")
        .ok_or_else(|| HealthError::Shape("/healthz has no `semantic` object".into()))?;
    if semantic.get("status").and_then(Value::as_str) != Some("ready") {
        let detail = semantic
            .get("detail")
            .and_then(Value::as_str)
            .unwrap_or("no reason given")
            .to_owned();
        return Err(HealthError::Disabled(detail));
    }
    let threshold = semantic
        .get("threshold")
        .and_then(Value::as_f64)
        .ok_or_else(|| HealthError::Shape("/healthz has no `semantic.threshold`".into()))?;
    Ok(GatewayInfo {
        version: body
            .get("version")
            .and_then(Value::as_str)
            .map(str::to_owned),
        threshold,
        guards: semantic
            .get("guards")
            .and_then(Value::as_str)
            .map(str::to_owned),
        model_dir: semantic
            .get("model_dir")
            .and_then(Value::as_str)
            .map(str::to_owned),
        fallbacks: semantic
            .get("fallbacks")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    })
}

/// The record of one pair.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PairResult {
    pub id: String,
    pub category: String,
    pub source: String,
    pub line: usize,
    pub same_answer: bool,
    /// `x-reprise-cache` of the lookup of `b`, or `error`.
    pub outcome: String,
    /// Served from `a`'s entry at the gateway's threshold.
    pub served: bool,
    /// 1 for an exact hit, `x-reprise-similarity` on a semantic hit, `x-reprise-nearest` on a miss.
    pub similarity: Option<f64>,
    /// `x-reprise-nearest-guard` of a miss: the literal guard that refuses `a`'s entry at any
    /// similarity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
    /// Lookups of this pair (of `a` or `b`) that skipped semantic matching (`x-reprise-semantic`).
    pub skipped_lookups: usize,
    pub error: Option<String>,
    /// `x-reprise-verified` of a served semantic hit: `judge` or `budget`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
    /// `x-reprise-verify`: the judge's verdict on this lookup (`same`, `different`, `unsure`), or
    /// `queued`/`dropped` in async mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
    /// The `reason=` of `x-reprise-verify: unsure; reason=…` (`timeout`, `over_budget`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify_reason: Option<String>,
    /// The judge's time on this lookup, `Server-Timing: judge;dur=`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge_ms: Option<f64>,
    /// Time from sending the lookup of `b` to its response head (a non-streamed answer's TTFT).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
}

impl PairResult {
    /// Whether the lookup of `b` got an answer that says something of the match: not an error,
    /// not skipped by the gateway.
    pub fn measured(&self) -> bool {
        self.error.is_none() && self.outcome != SKIPPED
    }

    /// What the sweep needs; `None` for a pair that could not be measured.
    pub fn scored(&self) -> Option<Scored> {
        self.measured().then_some(Scored {
            same_answer: self.same_answer,
            exact: self.outcome == "hit",
            similarity: self.similarity,
            guarded: self.guard.is_some(),
        })
    }
}

/// Everything a run recorded.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub url: String,
    pub run_id: String,
    pub gateway: GatewayInfo,
    /// Embedding fallbacks the gateway counted while the run went on (other traffic included).
    pub fallbacks_during_run: u64,
    /// In input order.
    pub results: Vec<PairResult>,
    pub wall_s: f64,
}

/// Runs every pair through the gateway; `progress` is called with the number done so far.
pub async fn run(
    config: &EvalConfig,
    pairs: Vec<Pair>,
    progress: impl Fn(usize) + Send + Sync,
) -> Result<Evaluation, EvalError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency.max(1) * 2)
        .tcp_nodelay(true)
        .timeout(config.request_timeout)
        .build()
        .map_err(|e| EvalError::Unreachable {
            url: config.root.clone(),
            detail: format!("HTTP client: {e}"),
        })?;
    let before = gateway_info(&client, &config.root).await?;
    let started = Instant::now();
    let done = AtomicUsize::new(0);
    let progress = Arc::new(progress);
    let mut results: Vec<(usize, PairResult)> =
        futures_util::stream::iter(pairs.into_iter().enumerate())
            .map(|(i, pair)| {
                let (client, progress, done) = (&client, progress.clone(), &done);
                async move {
                    let result = evaluate_pair(client, config, i, &pair).await;
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1);
                    (i, result)
                }
            })
            .buffer_unordered(config.concurrency.max(1))
            .collect()
            .await;
    results.sort_by_key(|(i, _)| *i);
    let wall_s = started.elapsed().as_secs_f64();
    let after = gateway_info(&client, &config.root).await?;
    Ok(Evaluation {
        url: config.root.clone(),
        run_id: config.run_id.clone(),
        fallbacks_during_run: after.fallbacks.saturating_sub(before.fallbacks),
        gateway: before,
        results: results.into_iter().map(|(_, r)| r).collect(),
        wall_s,
    })
}

/// The outcome of a pair whose every lookup of `b` skipped semantic matching.
pub const SKIPPED: &str = "skipped";

/// What one request reported.
#[derive(Debug, Clone, PartialEq)]
struct Reply {
    outcome: String,
    similarity: Option<f64>,
    nearest: Option<f64>,
    guard: Option<String>,
    /// `x-reprise-semantic: skipped; reason=…`: matched exactly only.
    skipped: bool,
    verified: Option<String>,
    verify: Option<String>,
    verify_reason: Option<String>,
    judge_ms: Option<f64>,
    /// From sending to the response head.
    head_ms: f64,
}

async fn evaluate_pair(
    client: &reqwest::Client,
    config: &EvalConfig,
    index: usize,
    pair: &Pair,
) -> PairResult {
    let mut result = PairResult {
        id: pair.id.clone(),
        category: pair.category.clone(),
        source: pair.source.clone(),
        line: pair.line,
        same_answer: pair.same_answer,
        outcome: "error".into(),
        served: false,
        similarity: None,
        guard: None,
        skipped_lookups: 0,
        error: None,
        verified: None,
        verify: None,
        verify_reason: None,
        judge_ms: None,
        ttft_ms: None,
    };
    let namespace = format!("eval-{}-{index}", config.run_id);
    match measure(
        client,
        config,
        &namespace,
        pair,
        &mut result.skipped_lookups,
    )
    .await
    {
        Ok(reply) => {
            result.served = matches!(reply.outcome.as_str(), "hit" | "semantic-hit");
            result.similarity = match reply.outcome.as_str() {
                "hit" => Some(1.0),
                "semantic-hit" => reply.similarity,
                _ => reply.nearest,
            };
            result.guard = reply.guard;
            result.outcome = reply.outcome;
            result.verified = reply.verified;
            result.verify = reply.verify;
            result.verify_reason = reply.verify_reason;
            result.judge_ms = reply.judge_ms;
            result.ttft_ms = Some(reply.head_ms);
        }
        Err(err) => result.error = Some(err),
    }
    result
}

/// Steps 1-3 of the protocol for one pair.
async fn measure(
    client: &reqwest::Client,
    config: &EvalConfig,
    namespace: &str,
    pair: &Pair,
    skipped: &mut usize,
) -> Result<Reply, String> {
    let first = send(client, config, namespace, &pair.a, false)
        .await
        .map_err(|e| format!("storing a: {e}"))?;
    // Stored without a vector: the backfill gives it one later, so `b` may ask for longer.
    let a_skipped = first.skipped;
    *skipped += usize::from(first.skipped);
    if first.outcome != "miss" {
        return Err(format!(
            "storing a: expected a miss in a fresh namespace, got `{}`",
            first.outcome
        ));
    }
    wait_until_stored(client, config, namespace, &pair.a).await?;
    // With equal contexts `a` and `b` share a partition, so the lookup must find `a` as a
    // candidate. When it does not, the index has not caught up with the store yet (the writer
    // adds the vector just after the entry) or an embedding fell back: ask again, briefly.
    let same_partition = pair.a.context() == pair.b.context();
    let mut attempt = 0;
    let give_up = Instant::now() + config.store_timeout;
    loop {
        let reply = send(client, config, namespace, &pair.b, true)
            .await
            .map_err(|e| format!("looking up b: {e}"))?;
        if reply.skipped && reply.outcome == "miss" {
            // The gateway did not match at all: nothing measured. Ask again while there is time.
            *skipped += 1;
            attempt += 1;
            if Instant::now() >= give_up {
                return Ok(Reply {
                    outcome: SKIPPED.to_owned(),
                    ..reply
                });
            }
            tokio::time::sleep(Duration::from_millis((20 * attempt).min(500))).await;
            continue;
        }
        let measured = match reply.outcome.as_str() {
            "hit" => true,
            "semantic-hit" => {
                if reply.similarity.is_none() {
                    return Err("a semantic hit without `x-reprise-similarity`".into());
                }
                true
            }
            "miss" => reply.nearest.is_some() || !same_partition,
            other => {
                return Err(format!(
                    "looking up b: unexpected `x-reprise-cache: {other}` (is the cache turned off?)"
                ))
            }
        };
        if measured {
            return Ok(reply);
        }
        attempt += 1;
        if attempt >= 5 && !(a_skipped && Instant::now() < give_up) {
            return Err(
                "b found no candidate although a and b share their context: a's vector never reached the index (embedding fallback?)"
                    .into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
    }
}

/// Re-sends `a` (not stored again) until the gateway serves it as an exact hit.
async fn wait_until_stored(
    client: &reqwest::Client,
    config: &EvalConfig,
    namespace: &str,
    a: &Prompt,
) -> Result<(), String> {
    let deadline = Instant::now() + config.store_timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        let reply = send(client, config, namespace, a, true)
            .await
            .map_err(|e| format!("checking a was stored: {e}"))?;
        if reply.outcome == "hit" {
            return Ok(());
        }
        if Instant::now() + pause > deadline {
            return Err(format!(
                "a was not stored within {:.1} s (last lookup: `{}`)",
                config.store_timeout.as_secs_f64(),
                reply.outcome
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// One non-streamed request (a chat completion, or a Messages API request with `--api anthropic`)
/// in `namespace`; `no_store` keeps its answer out of the cache.
async fn send(
    client: &reqwest::Client,
    config: &EvalConfig,
    namespace: &str,
    prompt: &Prompt,
    no_store: bool,
) -> Result<Reply, String> {
    let body = config.api.body(&config.model, &prompt.messages(), false);
    let mut request = config
        .api
        .post(client, &format!("{}/v1", config.root), &config.api_key)
        .header("x-reprise-namespace", namespace)
        .json(&body);
    if no_store {
        request = request.header("cache-control", "no-store");
    }
    let sent = Instant::now();
    let response = request.send().await.map_err(|e| e.to_string())?;
    let head_ms = sent.elapsed().as_secs_f64() * 1000.0;
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let number = |name: &str| -> Result<Option<f64>, String> {
        header(name)
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("`{name}: {v}` is not a number"))
            })
            .transpose()
    };
    let outcome = header("x-reprise-cache");
    let similarity = number("x-reprise-similarity")?;
    let nearest = number("x-reprise-nearest")?;
    // The sweep needs the guard below the gateway's threshold too, which `x-reprise-guard` (a
    // refusal of a candidate the threshold would serve) no longer names; older gateways sent only that.
    let guard = header("x-reprise-nearest-guard").or_else(|| header("x-reprise-guard"));
    let skipped = crate::bench::skipped_reason(header("x-reprise-semantic").as_deref()).is_some();
    let verified = verify::token(header("x-reprise-verified").as_deref());
    let verify = verify::token(header("x-reprise-verify").as_deref());
    let verify_reason = verify::reason(header("x-reprise-verify").as_deref());
    let judge_ms = verify::server_timing_ms(
        response
            .headers()
            .get_all("server-timing")
            .iter()
            .filter_map(|v| v.to_str().ok()),
        "judge",
    );
    // Read the whole body: the request is only over (and the connection reusable) at its end.
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        let snippet: String = text.chars().take(300).collect();
        return Err(format!("HTTP {}: {snippet}", status.as_u16()));
    }
    let outcome = outcome.ok_or_else(|| {
        "the response has no `x-reprise-cache` header: is the URL a Reprise gateway?".to_owned()
    })?;
    Ok(Reply {
        outcome,
        similarity,
        nearest,
        guard,
        skipped,
        verified,
        verify,
        verify_reason,
        judge_ms,
        head_ms,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn root_url_accepts_root_or_v1() {
        assert_eq!(root_url("http://h:1"), "http://h:1");
        assert_eq!(root_url("http://h:1/"), "http://h:1");
        assert_eq!(root_url("http://h:1/v1"), "http://h:1");
        assert_eq!(root_url(" http://h:1/v1/ "), "http://h:1");
    }

    #[test]
    fn health_gives_the_threshold_or_the_reason_it_cannot_run() {
        let ready = json!({"version": "0.1.0", "semantic": {"status": "ready", "threshold": 0.9, "fallbacks": 3, "model_dir": "m"}});
        let info = parse_health(&ready).ok().expect("ready health");
        assert_eq!(info.threshold, 0.9);
        assert_eq!(info.guards, None);
        let guarded =
            json!({"semantic": {"status": "ready", "threshold": 0.9, "guards": "numbers"}});
        let with_guards = parse_health(&guarded).ok().expect("ready health");
        assert_eq!(with_guards.guards.as_deref(), Some("numbers"));
        assert_eq!(info.fallbacks, 3);
        assert_eq!(info.version.as_deref(), Some("0.1.0"));
        let disabled = json!({"semantic": {"status": "disabled", "detail": "no model"}});
        assert!(
            matches!(parse_health(&disabled), Err(HealthError::Disabled(d)) if d == "no model")
        );
        assert!(matches!(
            parse_health(&json!({})),
            Err(HealthError::Shape(_))
        ));
    }

    /// An exact hit of a trap, every optional field empty: tests change what they need.
    pub(crate) fn pair_result() -> PairResult {
        PairResult {
            id: "x".into(),
            category: "c".into(),
            source: "s".into(),
            line: 1,
            same_answer: false,
            outcome: "hit".into(),
            served: true,
            similarity: Some(1.0),
            guard: None,
            skipped_lookups: 0,
            error: None,
            verified: None,
            verify: None,
            verify_reason: None,
            judge_ms: None,
            ttft_ms: None,
        }
    }

    #[test]
    fn results_give_the_sweep_its_inputs() {
        let mut r = pair_result();
        assert_eq!(
            r.scored(),
            Some(Scored {
                same_answer: false,
                exact: true,
                similarity: Some(1.0),
                guarded: false,
            })
        );
        r.outcome = "semantic-hit".into();
        assert!(!r.scored().expect("present").exact);
        r.outcome = "miss".into();
        r.guard = Some("numbers".into());
        let guarded = r.scored().expect("present");
        assert!(guarded.guarded && !guarded.served_at(0.0));
        r.error = Some("boom".into());
        assert_eq!(r.scored(), None);
    }
}
