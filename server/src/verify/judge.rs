//! The judge call: one OpenAI chat completion (temperature 0, a few tokens, a JSON verdict) asking
//! whether one correct answer to the cached prompt fully answers the new one, and the limits that
//! keep it cheap (a concurrency cap and a rate budget).
//!
//! The request is documented in the README ("The judge call"): the instruction is
//! `server/prompts/judge-v1.txt` (or the operator's `--judge-prompt` file) as the system message,
//! and the user message is one JSON object in a fenced block, so that a simulated judge reads the
//! two texts without parsing prose. Every failure is `unsure`, which is never served: a timeout, a
//! transport error, a status other than 2xx, an answer that is not one of the three verdicts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

/// The instruction shipped with the gateway.
pub const DEFAULT_PROMPT: &str = include_str!("../../prompts/judge-v1.txt");

/// The protocol version, in the JSON block (`reprise_judge`) and the `x-reprise-judge` header.
pub const PROTOCOL: u32 = 1;

/// Most characters of one prompt the judge is shown: a longer one is not judged (a cut question
/// could hide the very difference the judge is asked about).
pub const MAX_PROMPT_CHARS: usize = 8_000;

/// Most characters of the context (earlier turns) the judge is shown: the newest are kept. Both
/// prompts share it (they are in one partition), so cutting it hides no difference between them.
pub const MAX_CONTEXT_CHARS: usize = 8_000;

/// A verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Same,
    Different,
    Unsure(Unsure),
}

/// Why a verdict is `unsure`, or why the judge was not asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsure {
    /// The judge answered `unsure`.
    Answered,
    Timeout,
    /// Transport error or a status other than 2xx.
    Failed,
    /// An answer that is not a verdict.
    Unparseable,
    /// Not asked: the rate budget was spent.
    OverBudget,
    /// Not asked: a prompt is longer than [`MAX_PROMPT_CHARS`].
    TooLong,
    /// Not asked: no judge model, or no credential for a background call.
    NotConfigured,
}

impl Verdict {
    /// As in `x-reprise-verify`.
    pub fn header(self) -> String {
        match self {
            Verdict::Same => "same".to_owned(),
            Verdict::Different => "different".to_owned(),
            Verdict::Unsure(Unsure::Answered) => "unsure".to_owned(),
            Verdict::Unsure(why) => format!("unsure; reason={}", why.name()),
        }
    }

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Different => "different",
            Verdict::Unsure(_) => "unsure",
        }
    }
}

impl Unsure {
    pub fn name(self) -> &'static str {
        match self {
            Unsure::Answered => "answered",
            Unsure::Timeout => "timeout",
            Unsure::Failed => "failed",
            Unsure::Unparseable => "unparseable",
            Unsure::OverBudget => "over_budget",
            Unsure::TooLong => "too_long",
            Unsure::NotConfigured => "not_configured",
        }
    }
}

/// What the judge is shown: texts of one partition only.
#[derive(Debug, Clone, Serialize)]
pub struct Pair {
    pub system: Option<String>,
    pub context: Option<String>,
    pub cached: String,
    pub new: String,
}

/// Where and as whom a call goes.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL including `/v1`.
    pub url: String,
    pub model: String,
    /// Credential headers: the judge's key, or (sync only) the request's own.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub timeout: Duration,
}

/// One answered (or failed) call.
#[derive(Debug, Clone, Copy)]
pub struct Judged {
    pub verdict: Verdict,
    /// From the call's start, the wait for a free slot included.
    pub ms: f64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Calls by outcome, tokens and latency: the `reprise_judge_*` metrics themselves (registered
/// with the gateway's [`crate::stats::Stats`]), read back for `/admin/stats`.
pub struct JudgeCounts {
    /// Calls that reached the judge, by verdict.
    calls: IntCounterVec,
    /// Near matches not judged (and not served), by reason: over_budget, too_long, dropped.
    skipped: IntCounterVec,
    tokens: IntCounterVec,
    /// Of the `unsure` calls, those where the judge did not answer usably (timeout, failed,
    /// unparseable): the alerting rules need them apart from an honest `unsure`.
    errors: IntCounterVec,
    duration: Histogram,
    /// Pairs waiting for a background verdict.
    pub(super) queue_depth: IntGauge,
    /// Of the `unsure` calls, those that timed out and those that failed (`/admin/stats` only).
    pub timeouts: AtomicU64,
    pub failures: AtomicU64,
    /// The newest call latencies, for p50/p99.
    latencies: Mutex<std::collections::VecDeque<f64>>,
    /// What the calls cost in money, a cost against what hits saved (`/admin/stats` `savings.judge`).
    cost: Mutex<reprise_wire::JudgeCost>,
    cost_total: prometheus::Counter,
    /// The price table the calls are priced with (set once the gateway's is built).
    prices: std::sync::OnceLock<Arc<crate::savings::Accounting>>,
}

/// Histogram buckets of judge call latency, in seconds.
const BUCKETS_S: [f64; 10] = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

const LATENCIES_KEPT: usize = 2048;

/// Metric constructors only fail on invalid names or labels, which are constants here.
fn unreachable_metric<T>(err: prometheus::Error) -> T {
    panic!("invalid metric definition: {err}")
}

fn counter_vec(name: &str, help: &str, label: &str, values: &[&str]) -> IntCounterVec {
    let vec =
        IntCounterVec::new(Opts::new(name, help), &[label]).unwrap_or_else(unreachable_metric);
    // Every series from the start: a dashboard's rate of a series that appears late is wrong.
    for value in values {
        vec.with_label_values(&[value]);
    }
    vec
}

impl Default for JudgeCounts {
    fn default() -> Self {
        Self {
            calls: counter_vec(
                "reprise_judge_calls_total",
                "Judge calls on near matches, by verdict.",
                "verdict",
                &["same", "different", "unsure"],
            ),
            skipped: counter_vec(
                "reprise_judge_skipped_total",
                "Near matches not judged (and not served), by reason.",
                "reason",
                &["over_budget", "too_long", "dropped"],
            ),
            tokens: counter_vec(
                "reprise_judge_tokens_total",
                "Tokens the judge calls cost.",
                "kind",
                &["prompt", "completion"],
            ),
            errors: counter_vec(
                "reprise_judge_errors_total",
                "Judge calls without a usable verdict (counted as unsure, never served), by kind.",
                "kind",
                &["timeout", "failed", "unparseable"],
            ),
            duration: Histogram::with_opts(
                HistogramOpts::new("reprise_judge_duration_seconds", "Judge call latency.")
                    .buckets(BUCKETS_S.to_vec()),
            )
            .unwrap_or_else(unreachable_metric),
            queue_depth: IntGauge::new(
                "reprise_judge_queue_depth",
                "Pairs waiting for a background verdict.",
            )
            .unwrap_or_else(unreachable_metric),
            timeouts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            latencies: Mutex::default(),
            cost: Mutex::default(),
            cost_total: prometheus::Counter::new(
                "reprise_judge_cost_total",
                "US dollars the judge calls cost at the judge model's price (a cost against reprise_cost_saved_total).",
            )
            .unwrap_or_else(unreachable_metric),
            prices: std::sync::OnceLock::new(),
        }
    }
}

impl JudgeCounts {
    /// Prices the calls from now on with `prices`.
    pub fn price_with(&self, prices: Arc<crate::savings::Accounting>) {
        let _ = self.prices.set(prices);
    }

    /// What the calls cost so far.
    pub fn cost(&self) -> reprise_wire::JudgeCost {
        self.cost.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds a call's tokens, priced at `model`'s rate, to the cost.
    fn charge(&self, model: &str, judged: &Judged) {
        let priced = self
            .prices
            .get()
            .and_then(|p| p.cost_of(model, judged.prompt_tokens, judged.completion_tokens));
        let mut cost = self.cost.lock().unwrap_or_else(|e| e.into_inner());
        cost.calls += 1;
        cost.input_tokens += judged.prompt_tokens;
        cost.output_tokens += judged.completion_tokens;
        match priced {
            Some(usd) => {
                cost.cost_usd += usd;
                self.cost_total.inc_by(usd);
            }
            None => cost.unpriced += 1,
        }
    }

    fn record(&self, model: &str, judged: &Judged) {
        match judged.verdict {
            Verdict::Unsure(Unsure::OverBudget) => return self.skip("over_budget"),
            Verdict::Unsure(Unsure::TooLong) => return self.skip("too_long"),
            Verdict::Unsure(Unsure::NotConfigured) => return,
            Verdict::Unsure(Unsure::Timeout) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
                self.errors.with_label_values(&["timeout"]).inc();
            }
            Verdict::Unsure(Unsure::Failed) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                self.errors.with_label_values(&["failed"]).inc();
            }
            Verdict::Unsure(Unsure::Unparseable) => {
                self.errors.with_label_values(&["unparseable"]).inc();
            }
            _ => {}
        }
        self.calls.with_label_values(&[judged.verdict.name()]).inc();
        self.charge(model, judged);
        self.tokens
            .with_label_values(&["prompt"])
            .inc_by(judged.prompt_tokens);
        self.tokens
            .with_label_values(&["completion"])
            .inc_by(judged.completion_tokens);
        self.duration.observe(judged.ms / 1000.0);
        let mut kept = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() == LATENCIES_KEPT {
            kept.pop_front();
        }
        kept.push_back(judged.ms);
    }

    /// Counts a near match that was not judged, by reason.
    pub(super) fn skip(&self, reason: &str) {
        self.skipped.with_label_values(&[reason]).inc();
    }

    /// Calls that reached the judge with this verdict (`same`, `different`, `unsure`).
    pub fn verdicts(&self, verdict: &str) -> u64 {
        self.calls.with_label_values(&[verdict]).get()
    }

    /// Calls that reached the judge.
    pub fn calls(&self) -> u64 {
        ["same", "different", "unsure"]
            .into_iter()
            .map(|v| self.verdicts(v))
            .sum()
    }

    pub fn skipped(&self, reason: &str) -> u64 {
        self.skipped.with_label_values(&[reason]).get()
    }

    pub fn tokens(&self, kind: &str) -> u64 {
        self.tokens.with_label_values(&[kind]).get()
    }

    /// p50 and p99 of the newest calls' latency, in ms.
    pub fn latency(&self) -> (Option<f64>, Option<f64>) {
        let kept: Vec<f64> = self
            .latencies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        (
            crate::timing::percentile(&kept, 0.50),
            crate::timing::percentile(&kept, 0.99),
        )
    }

    /// The metrics, for the gateway's registry.
    pub fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.calls.clone()),
            Box::new(self.skipped.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.errors.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.queue_depth.clone()),
            Box::new(self.cost_total.clone()),
        ]
    }
}

/// A token bucket: `rate` calls per second, bursts of up to one second's worth.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.rate.max(1.0));
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The judge client, shared by every request.
pub struct Judge {
    client: reqwest::Client,
    prompt: Arc<str>,
    permits: Semaphore,
    bucket: Mutex<Bucket>,
    pub counts: JudgeCounts,
}

impl Judge {
    /// `prompt`: the instruction; `max_concurrency` calls at once; `rate` calls per second (0: no
    /// budget).
    pub fn new(
        prompt: Arc<str>,
        max_concurrency: usize,
        rate: f64,
        connect_timeout: Duration,
    ) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("judge client: {e}"))?;
        Ok(Self {
            client,
            prompt,
            permits: Semaphore::new(max_concurrency.max(1)),
            bucket: Mutex::new(Bucket {
                rate,
                tokens: rate.max(1.0),
                at: Instant::now(),
            }),
            counts: JudgeCounts::default(),
        })
    }

    /// The chat completion request of one judge call.
    pub fn body(&self, model: &str, pair: &Pair) -> Value {
        let block = json!({
            "reprise_judge": PROTOCOL,
            "system": pair.system,
            "context": pair.context,
            "cached": pair.cached,
            "new": pair.new,
        });
        json!({
            "model": model,
            "temperature": 0,
            "max_tokens": 16,
            "stream": false,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "reprise_verdict",
                "strict": true,
                "schema": {
                    "type": "object",
                    "properties": {"verdict": {"type": "string", "enum": ["same", "different", "unsure"]}},
                    "required": ["verdict"],
                    "additionalProperties": false
                }
            }},
            "messages": [
                {"role": "system", "content": &*self.prompt},
                {"role": "user", "content": format!("```json\n{block}\n```")}
            ]
        })
    }

    /// Asks the judge about `pair`; never fails, never waits past `target.timeout`.
    pub async fn ask(&self, target: &Target, pair: &Pair) -> Judged {
        let started = Instant::now();
        let judged = |verdict, prompt_tokens, completion_tokens| Judged {
            verdict,
            ms: crate::timing::millis(started.elapsed()),
            prompt_tokens,
            completion_tokens,
        };
        let result = if pair.cached.chars().count() > MAX_PROMPT_CHARS
            || pair.new.chars().count() > MAX_PROMPT_CHARS
        {
            judged(Verdict::Unsure(Unsure::TooLong), 0, 0)
        } else if !self
            .bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(started)
        {
            judged(Verdict::Unsure(Unsure::OverBudget), 0, 0)
        } else {
            match tokio::time::timeout(target.timeout, self.call(target, pair)).await {
                Ok((verdict, p, c)) => judged(verdict, p, c),
                Err(_) => judged(Verdict::Unsure(Unsure::Timeout), 0, 0),
            }
        };
        self.counts.record(&target.model, &result);
        result
    }

    async fn call(&self, target: &Target, pair: &Pair) -> (Verdict, u64, u64) {
        let Ok(_permit) = self.permits.acquire().await else {
            return (Verdict::Unsure(Unsure::Failed), 0, 0);
        };
        let url = format!("{}/chat/completions", target.url.trim_end_matches('/'));
        let mut request = self
            .client
            .post(url)
            .header("x-reprise-judge", PROTOCOL.to_string())
            .json(&self.body(&target.model, pair));
        for (name, value) in &target.headers {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                tracing::warn!(status = r.status().as_u16(), "the judge answered an error");
                return (Verdict::Unsure(Unsure::Failed), 0, 0);
            }
            Err(err) => {
                tracing::warn!(error = %err, "the judge call failed");
                return (Verdict::Unsure(Unsure::Failed), 0, 0);
            }
        };
        let Ok(body) = response.json::<Value>().await else {
            return (Verdict::Unsure(Unsure::Unparseable), 0, 0);
        };
        let tokens = |field: &str| body["usage"][field].as_u64().unwrap_or(0);
        let verdict = body["choices"][0]["message"]["content"]
            .as_str()
            .and_then(parse_verdict)
            .unwrap_or(Verdict::Unsure(Unsure::Unparseable));
        (
            verdict,
            tokens("prompt_tokens"),
            tokens("completion_tokens"),
        )
    }
}

/// Reads a verdict: `{"verdict": "same"}` (bare, or in a ```json fence), or the bare word.
pub fn parse_verdict(content: &str) -> Option<Verdict> {
    let text = content.trim();
    let text = text
        .strip_prefix("```json")
        .or_else(|| text.strip_prefix("```"))
        .and_then(|t| t.trim_end().strip_suffix("```"))
        .unwrap_or(text)
        .trim();
    let word = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => map.get("verdict")?.as_str()?.to_ascii_lowercase(),
        Ok(Value::String(s)) => s.to_ascii_lowercase(),
        _ => text
            .trim_matches(|c: char| !c.is_alphabetic())
            .to_ascii_lowercase(),
    };
    match word.as_str() {
        "same" => Some(Verdict::Same),
        "different" => Some(Verdict::Different),
        "unsure" => Some(Verdict::Unsure(Unsure::Answered)),
        _ => None,
    }
}

/// The last `max` characters of `text` (the newest turns of a context), marked as cut.
pub fn newest(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_owned();
    }
    let skip = count - max;
    let (at, _) = text.char_indices().nth(skip).unwrap_or((0, ' '));
    format!("[… {skip} earlier characters not shown]\n{}", &text[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_read_in_the_forms_models_write_them() {
        for (content, verdict) in [
            (r#"{"verdict":"same"}"#, Some(Verdict::Same)),
            (" {\"verdict\": \"Different\"}\n", Some(Verdict::Different)),
            (
                "```json\n{\"verdict\":\"unsure\"}\n```",
                Some(Verdict::Unsure(Unsure::Answered)),
            ),
            ("same", Some(Verdict::Same)),
            ("Different.", Some(Verdict::Different)),
            (r#"{"verdict":"maybe"}"#, None),
            ("The questions are the same.", None),
            (r#"{"answer":"same"}"#, None),
            ("", None),
        ] {
            assert_eq!(parse_verdict(content), verdict, "{content:?}");
        }
    }

    #[test]
    fn the_request_carries_both_texts_in_one_json_block() {
        let judge =
            Judge::new(Arc::from("instruction"), 2, 0.0, Duration::from_secs(1)).expect("judge");
        let pair = Pair {
            system: Some("You are terse.".into()),
            context: None,
            cached: "How do I reset my password?\n```".into(),
            new: "how can I reset my password".into(),
        };
        let body = judge.body("judge-model", &pair);
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["messages"][0]["content"], "instruction");
        let user = body["messages"][1]["content"].as_str().expect("text");
        let inner = user
            .strip_prefix("```json\n")
            .and_then(|t| t.strip_suffix("\n```"))
            .expect("one fenced block");
        // One line: a fence inside a text cannot end the block early.
        assert!(!inner.contains('\n'));
        let block: Value = serde_json::from_str(inner).expect("json");
        assert_eq!(block["reprise_judge"], 1);
        assert_eq!(block["cached"], pair.cached);
        assert_eq!(block["new"], pair.new);
        assert_eq!(block["system"], "You are terse.");
        assert!(block["context"].is_null());
    }

    #[test]
    fn the_rate_budget_refills_over_time() {
        let start = Instant::now();
        let mut bucket = Bucket {
            rate: 2.0,
            tokens: 2.0,
            at: start,
        };
        assert!(bucket.take(start));
        assert!(bucket.take(start));
        assert!(!bucket.take(start));
        assert!(bucket.take(start + Duration::from_millis(600)));
        let mut unlimited = Bucket {
            rate: 0.0,
            tokens: 0.0,
            at: start,
        };
        assert!((0..100).all(|_| unlimited.take(start)));
    }

    #[test]
    fn a_long_context_keeps_its_newest_characters() {
        let text = "a".repeat(10) + "b";
        let cut = newest(&text, 3);
        assert!(cut.ends_with("aab"), "{cut}");
        assert!(cut.contains("8 earlier characters"), "{cut}");
        assert_eq!(newest("short", 10), "short");
    }
}
