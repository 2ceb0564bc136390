//! The benchmark driver: sends chat completions to one or two OpenAI-compatible base URLs and measures
//! what an application feels (client-side time to first token, inter-token gaps, total time), along
//! with what the gateway says about each request (cache outcome, TTFT saved, its phase timing).
//!
//! Closed loop (a fixed number of workers, each sending its next request when the last one is
//! done) or open loop (arrivals on a fixed schedule whatever the responses do, see `openloop`).
//! With a second URL (`--compare`) every request is sent to both, so the two are measured side by
//! side in one run on the same machine state; the report then gives each one's percentiles, the
//! paired differences (e.g. the gateway's added latency) and the ratios.

pub mod chart;
pub mod cli;
pub mod openloop;
pub mod paraphrase;
pub mod report;
pub mod timing;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

use timing::{PhaseMeans, Phases};
use workload::{Item, Kind, Planned, Workload};

/// What to send and how.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Base URLs including `/v1`: the target, and optionally a second one measured alongside.
    pub targets: Vec<String>,
    /// More base URLs of the first target (replicas of one service without a load balancer in
    /// front): request `i` of the first target goes to `targets[0]` and these in turn, by `i`.
    pub round_robin: Vec<String>,
    pub api_key: String,
    pub model: String,
    /// Upper bound on measured requests per target (`usize::MAX`: bounded by time only).
    pub requests: usize,
    /// Closed loop: concurrent workers.
    pub concurrency: usize,
    /// Open loop: arrivals per second on a fixed schedule (`None`: closed loop).
    pub rate: Option<f64>,
    /// Open loop: how arrivals are spaced (even, or Poisson at the same mean rate).
    pub arrivals: openloop::Arrivals,
    /// Seeds the Poisson schedule (the workload has its own seed from the same flag).
    pub seed: u64,
    /// Open loop: requests in flight at most; an arrival finding them all busy is dropped.
    pub max_in_flight: usize,
    pub stream: bool,
    /// Requests per target sent first and left out of the results (connection set-up, warm caches).
    pub warmup: usize,
    /// Distinguishes this run's generated prompts from any earlier run's.
    pub run_id: String,
    /// Upper bound on the whole run (no request starts after it).
    pub max_duration: Duration,
    /// Sent as `x-reprise-namespace`, so a run starts from a cache of its own.
    pub namespace: Option<String>,
}

impl BenchConfig {
    /// The base URL that request `index` of `target` is sent to.
    pub fn url_of(&self, target: usize, index: usize) -> &str {
        if target == 0 && !self.round_robin.is_empty() {
            match index % (self.round_robin.len() + 1) {
                0 => &self.targets[0],
                k => &self.round_robin[k - 1],
            }
        } else {
            &self.targets[target]
        }
    }
}

/// Normalizes a base URL: a URL without a path is a gateway (or server) root, and `/v1` is
/// appended; one with a path is used as given (without a trailing slash).
pub fn base_url(raw: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(raw.trim()).map_err(|e| format!("invalid URL {raw:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("URL {raw:?} is not http or https"));
    }
    let text = url.as_str().trim_end_matches('/');
    Ok(if url.path() == "/" || url.path().is_empty() {
        format!("{text}/v1")
    } else {
        text.to_owned()
    })
}

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub target: usize,
    pub index: usize,
    /// How the request relates to earlier ones by construction.
    pub kind: Kind,
    pub status: u16,
    /// `x-reprise-cache` as the gateway sent it, `none` without the header.
    pub outcome: String,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub tokens: usize,
    /// Gaps between successive content chunks as the client received them.
    #[serde(skip)]
    pub gaps_ms: Vec<f64>,
    /// `x-reprise-ttft-saved-ms`: the original miss's TTFT minus this hit's.
    pub ttft_saved_ms: Option<f64>,
    /// `x-reprise-similarity` of a semantic hit.
    pub similarity: Option<f64>,
    /// The reason in `x-reprise-semantic: skipped; reason=…`: the gateway matched this request
    /// exactly only (its embedding was refused, late or failed).
    pub semantic_skipped: Option<String>,
    /// The gateway's phase timing (stream comment or `Server-Timing`).
    pub phases: Option<Phases>,
    /// `x-reprise-entry`: the entry that served a hit.
    pub entry: Option<String>,
    /// `x-reprise-verified` of a verified semantic hit (`judge` or `budget`).
    pub verified: Option<String>,
    /// `x-reprise-verify`: what the verify stage did (a verdict, `queued`, `dropped`).
    pub verify: Option<String>,
    /// `x-reprise-judge-ms`: the judge's time on this request.
    pub judge_ms: Option<f64>,
    /// Open loop: how late the request was sent against its schedule.
    pub lag_ms: Option<f64>,
    pub error: Option<String>,
}

impl Sample {
    pub fn new(target: usize, index: usize, kind: Kind) -> Self {
        Self {
            target,
            index,
            kind,
            status: 0,
            outcome: "none".to_owned(),
            ttft_ms: None,
            total_ms: 0.0,
            tokens: 0,
            gaps_ms: Vec::new(),
            ttft_saved_ms: None,
            similarity: None,
            semantic_skipped: None,
            phases: None,
            entry: None,
            verified: None,
            verify: None,
            judge_ms: None,
            lag_ms: None,
            error: None,
        }
    }
}

/// The outcome name of an `x-reprise-cache` value (`none` without the header).
pub fn outcome_of(header: Option<&str>) -> String {
    match header.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => v.to_ascii_lowercase(),
        None => "none".to_owned(),
    }
}

/// The reason of an `x-reprise-semantic: skipped; reason=…` header (`unknown` when it names none);
/// `None` without the header or for another value.
pub fn skipped_reason(header: Option<&str>) -> Option<String> {
    let mut parts = header?.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("skipped") {
        return None;
    }
    let reason = parts
        .find_map(|p| p.strip_prefix("reason="))
        .map(|r| r.trim().to_ascii_lowercase())
        .filter(|r| !r.is_empty());
    Some(reason.unwrap_or_else(|| "unknown".to_owned()))
}

/// `semantic matching skipped: N of M misses (x%): overload N, …`, from `x-reprise-semantic`.
pub fn skipped_line(t: &TargetSummary) -> String {
    let skipped: usize = t.semantic_skipped.values().sum();
    let misses = t.outcomes.get("miss").copied().unwrap_or(0);
    let reasons: Vec<String> = t
        .semantic_skipped
        .iter()
        .map(|(r, c)| format!("{r} {c}"))
        .collect();
    format!(
        "semantic matching skipped: {skipped} of {misses} misses ({:.1}%){}",
        skipped as f64 * 100.0 / misses.max(1) as f64,
        if reasons.is_empty() {
            String::new()
        } else {
            format!(": {}", reasons.join(", "))
        }
    )
}

/// Nearest-rank percentile of unsorted samples.
pub fn percentile(samples: &[f64], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// `num / den`, when both exist and the denominator is above zero.
pub fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 && n.is_finite() && d.is_finite() => Some(n / d),
        _ => None,
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(samples: &[f64]) -> Option<Self> {
        Some(Self {
            p50: percentile(samples, 0.50)?,
            p90: percentile(samples, 0.90)?,
            p99: percentile(samples, 0.99)?,
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
        })
    }
}

/// Latency of the requests of one cache outcome.
#[derive(Debug, Clone, Serialize)]
pub struct OutcomeSummary {
    pub count: usize,
    pub ttft_ms: Option<Percentiles>,
    pub total_ms: Option<Percentiles>,
    /// Inter-token gaps, pooled over the outcome's requests.
    pub itl_ms: Option<Percentiles>,
    /// Means of the gateway's phases over the requests that carried a timing.
    pub phases: Option<PhaseMeans>,
}

/// Shares of the successful requests served by each kind of cache answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HitRates {
    pub exact: f64,
    pub semantic: f64,
    pub coalesced: f64,
    /// Any of the three.
    pub served: f64,
}

impl HitRates {
    /// `None` when no request carried an `x-reprise-cache` header (not a gateway).
    pub fn of(outcomes: &BTreeMap<String, usize>) -> Option<Self> {
        let ok: usize = outcomes.values().sum();
        let headed: usize = outcomes
            .iter()
            .filter(|(o, _)| o.as_str() != "none")
            .map(|(_, c)| c)
            .sum();
        if ok == 0 || headed == 0 {
            return None;
        }
        let share = |o: &str| outcomes.get(o).copied().unwrap_or(0) as f64 / ok as f64;
        let (exact, semantic, coalesced) =
            (share("hit"), share("semantic-hit"), share("coalesced"));
        Some(Self {
            exact,
            semantic,
            coalesced,
            served: exact + semantic + coalesced,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    pub url: String,
    pub requests: usize,
    pub errors: usize,
    pub outcomes: BTreeMap<String, usize>,
    pub by_outcome: BTreeMap<String, OutcomeSummary>,
    /// Successful requests by construction (new, repeat, paraphrase), then by cache outcome.
    pub by_construction: BTreeMap<Kind, BTreeMap<String, usize>>,
    pub hit_rate: Option<HitRates>,
    /// Miss TTFT p50 divided by hit TTFT p50, when both were seen.
    pub hit_speedup_p50: Option<f64>,
    /// Sum of `x-reprise-ttft-saved-ms` over the hits, in seconds.
    pub ttft_saved_s: f64,
    /// Similarity of the semantic hits.
    pub similarity: Option<Percentiles>,
    /// Successful requests whose lookup skipped semantic matching (`x-reprise-semantic`), by reason.
    pub semantic_skipped: BTreeMap<String, usize>,
    pub ttft_ms: Option<Percentiles>,
    pub total_ms: Option<Percentiles>,
    pub itl_ms: Option<Percentiles>,
    /// Successful requests per second of wall time.
    pub requests_per_s: f64,
    /// Closed loop: concurrency divided by the mean total time, i.e. what this target sustains at
    /// that concurrency on its own (with `--compare` the targets share the wall time, so this is
    /// the figure that tells them apart).
    pub service_rate_per_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Percentiles of target-0 minus target-1 TTFT over the same prompt (paired).
    pub paired_ttft_diff_ms: Option<Percentiles>,
    /// Target-1 TTFT p50 divided by target-0 TTFT p50.
    pub ttft_p50_ratio: Option<f64>,
    /// Target-1 TTFT p99 divided by target-0 TTFT p99.
    pub ttft_p99_ratio: Option<f64>,
    /// Target-1 total-time p50 divided by target-0's.
    pub total_p50_ratio: Option<f64>,
    /// Target-1 throughput divided by target-0's (service rate in closed loop, completed requests
    /// per second in open loop).
    pub throughput_ratio: Option<f64>,
}

/// How the run was driven.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RunInfo {
    /// When the run started (HTTP date, UTC).
    pub started: String,
    /// `closed loop, concurrency N` or `open loop, R/s`.
    pub mode: String,
    pub workload: String,
    pub stream: bool,
    pub namespace: Option<String>,
    /// Measured requests drawn by construction (each sent to every target).
    pub constructed: BTreeMap<Kind, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub run: RunInfo,
    pub targets: Vec<TargetSummary>,
    pub comparison: Option<Comparison>,
    pub open_loop: Option<openloop::OpenLoopStats>,
    pub wall_s: f64,
    /// Every measured request (for the charts; left out of the JSON).
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

fn mode_of(config: &BenchConfig) -> String {
    match config.rate {
        Some(rate) => match config.arrivals {
            openloop::Arrivals::Uniform => format!(
                "open loop, {rate} requests/s, at most {} in flight",
                config.max_in_flight
            ),
            openloop::Arrivals::Poisson => format!(
                "open loop, Poisson arrivals at {rate} requests/s (seed {}), at most {} in flight",
                config.seed, config.max_in_flight
            ),
        },
        None => format!("closed loop, concurrency {}", config.concurrency),
    }
}

/// Summarizes samples per target, and pairs them by request when there are two targets.
pub fn summarize(config: &BenchConfig, samples: &[Sample], wall: Duration) -> Report {
    let targets = config
        .targets
        .iter()
        .enumerate()
        .map(|(t, url)| {
            // A target spread over replicas is named by all of its URLs.
            let name = match t {
                0 if !config.round_robin.is_empty() => {
                    format!("{url} + {} (in turn)", config.round_robin.join(" + "))
                }
                _ => url.clone(),
            };
            summarize_target(config, t, &name, samples, wall)
        })
        .collect::<Vec<_>>();
    let comparison = (config.targets.len() == 2).then(|| {
        let by_index = |t: usize| -> BTreeMap<usize, f64> {
            samples
                .iter()
                .filter(|s| s.target == t && s.error.is_none())
                .filter_map(|s| s.ttft_ms.map(|v| (s.index, v)))
                .collect()
        };
        let (a, b) = (by_index(0), by_index(1));
        let diffs: Vec<f64> = a
            .iter()
            .filter_map(|(i, ta)| b.get(i).map(|tb| ta - tb))
            .collect();
        let (x, y) = (&targets[0], &targets[1]);
        let pick = |t: &TargetSummary, f: fn(&Percentiles) -> f64| t.ttft_ms.as_ref().map(f);
        let throughput = |t: &TargetSummary| match config.rate {
            Some(_) => Some(t.requests_per_s),
            None => t.service_rate_per_s,
        };
        Comparison {
            paired_ttft_diff_ms: Percentiles::of(&diffs),
            ttft_p50_ratio: ratio(pick(y, |p| p.p50), pick(x, |p| p.p50)),
            ttft_p99_ratio: ratio(pick(y, |p| p.p99), pick(x, |p| p.p99)),
            total_p50_ratio: ratio(
                y.total_ms.as_ref().map(|p| p.p50),
                x.total_ms.as_ref().map(|p| p.p50),
            ),
            throughput_ratio: ratio(throughput(y), throughput(x)),
        }
    });
    Report {
        run: RunInfo {
            mode: mode_of(config),
            stream: config.stream,
            namespace: config.namespace.clone(),
            ..RunInfo::default()
        },
        targets,
        comparison,
        open_loop: None,
        wall_s: wall.as_secs_f64(),
        samples: Vec::new(),
    }
}

fn summarize_target(
    config: &BenchConfig,
    t: usize,
    url: &str,
    samples: &[Sample],
    wall: Duration,
) -> TargetSummary {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.target == t).collect();
    let ok: Vec<&Sample> = mine.iter().filter(|s| s.error.is_none()).copied().collect();
    let mut outcomes = BTreeMap::new();
    let mut by_construction: BTreeMap<Kind, BTreeMap<String, usize>> = BTreeMap::new();
    let mut semantic_skipped = BTreeMap::new();
    for s in &ok {
        if let Some(reason) = &s.semantic_skipped {
            *semantic_skipped.entry(reason.clone()).or_insert(0) += 1;
        }
        *outcomes.entry(s.outcome.clone()).or_insert(0) += 1;
        *by_construction
            .entry(s.kind)
            .or_default()
            .entry(s.outcome.clone())
            .or_insert(0) += 1;
    }
    let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft_ms).collect();
    let total: Vec<f64> = ok.iter().map(|s| s.total_ms).collect();
    let gaps: Vec<f64> = ok.iter().flat_map(|s| s.gaps_ms.iter().copied()).collect();
    let by_outcome: BTreeMap<String, OutcomeSummary> = outcomes
        .iter()
        .map(|(outcome, count)| {
            let of: Vec<&Sample> = ok
                .iter()
                .filter(|s| &s.outcome == outcome)
                .copied()
                .collect();
            let ttft: Vec<f64> = of.iter().filter_map(|s| s.ttft_ms).collect();
            let total: Vec<f64> = of.iter().map(|s| s.total_ms).collect();
            let gaps: Vec<f64> = of.iter().flat_map(|s| s.gaps_ms.iter().copied()).collect();
            let summary = OutcomeSummary {
                count: *count,
                ttft_ms: Percentiles::of(&ttft),
                total_ms: Percentiles::of(&total),
                itl_ms: Percentiles::of(&gaps),
                phases: PhaseMeans::of(of.iter().filter_map(|s| s.phases.as_ref())),
            };
            (outcome.clone(), summary)
        })
        .collect();
    let p50 = |o: &str| {
        by_outcome
            .get(o)
            .and_then(|s| s.ttft_ms.as_ref())
            .map(|p| p.p50)
    };
    let similarity: Vec<f64> = ok
        .iter()
        .filter(|s| s.outcome == "semantic-hit")
        .filter_map(|s| s.similarity)
        .collect();
    let mean_total_s = (!total.is_empty())
        .then(|| total.iter().sum::<f64>() / total.len() as f64 / 1000.0)
        .filter(|m| *m > 0.0);
    TargetSummary {
        url: url.to_owned(),
        requests: mine.len(),
        errors: mine.len() - ok.len(),
        hit_rate: HitRates::of(&outcomes),
        hit_speedup_p50: ratio(p50("miss"), p50("hit").or(p50("semantic-hit"))),
        // A fold from +0.0: an empty float `sum` is -0.0, printed as "-0.00 s".
        ttft_saved_s: ok
            .iter()
            .filter_map(|s| s.ttft_saved_ms)
            .fold(0.0, |a, b| a + b)
            / 1000.0,
        similarity: Percentiles::of(&similarity),
        semantic_skipped,
        outcomes,
        by_outcome,
        by_construction,
        ttft_ms: Percentiles::of(&ttft),
        total_ms: Percentiles::of(&total),
        itl_ms: Percentiles::of(&gaps),
        requests_per_s: ok.len() as f64 / wall.as_secs_f64().max(1e-9),
        service_rate_per_s: match config.rate {
            Some(_) => None,
            None => mean_total_s.map(|m| config.concurrency.max(1) as f64 / m),
        },
    }
}

/// The request body of a planned item.
fn body(config: &BenchConfig, item: &Item) -> Value {
    json!({
        "model": item.model.as_deref().unwrap_or(&config.model),
        "stream": config.stream,
        "messages": *item.messages,
    })
}

const WORDS: &[&str] = &[
    "harbor",
    "violin",
    "glacier",
    "tax",
    "recipe",
    "quantum",
    "garden",
    "invoice",
    "volcano",
    "sonnet",
    "kernel",
    "mortgage",
    "penguin",
    "telescope",
    "allergy",
    "bicycle",
    "copper",
    "election",
    "fossil",
    "guitar",
    "hurricane",
    "insulin",
    "jazz",
    "kayak",
    "lumber",
    "marathon",
    "neuron",
    "orchid",
    "passport",
    "quarry",
    "rhubarb",
    "satellite",
    "tariff",
    "umbrella",
    "vaccine",
    "walrus",
    "xylophone",
    "yeast",
    "zeppelin",
    "algebra",
    "bakery",
    "cathedral",
    "dolphin",
    "espresso",
    "falcon",
    "granite",
    "hammock",
    "igloo",
    "jackal",
    "ketchup",
    "lantern",
    "magnet",
    "nebula",
    "oyster",
    "pyramid",
    "quilt",
    "robot",
    "saffron",
    "tornado",
    "unicorn",
    "velvet",
    "whisky",
    "yoga",
    "zucchini",
    "antenna",
    "blizzard",
    "cactus",
    "diesel",
    "emerald",
    "firewall",
    "gazelle",
    "helium",
    "iceberg",
    "jigsaw",
    "koala",
    "lemonade",
    "meteor",
    "nutmeg",
];

/// A prompt of its own for every index: ten words drawn by a hash, so generated prompts are far
/// apart in meaning and a semantic cache cannot serve one for another (a shared template would).
fn generated_prompt(run_id: &str, index: usize) -> String {
    let mut reader = blake3::Hasher::new()
        .update(run_id.as_bytes())
        .update(&index.to_le_bytes())
        .finalize_xof();
    let words: Vec<&str> = (0..10)
        .map(|_| {
            let mut b = [0u8; 2];
            reader.fill(&mut b);
            WORDS[usize::from(u16::from_le_bytes(b)) % WORDS.len()]
        })
        .collect();
    format!("Tell me about {} ({run_id}-{index}).", words.join(" "))
}

/// Sends one request and measures it from the client's side.
pub async fn measure(
    client: &reqwest::Client,
    config: &BenchConfig,
    target: usize,
    index: usize,
    planned: &Planned,
) -> Sample {
    let body = body(config, &planned.item);
    let mut sample = Sample::new(target, index, planned.kind);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut request = client
        .post(format!("{}/chat/completions", config.url_of(target, index)))
        .bearer_auth(&config.api_key)
        .json(&body);
    if let Some(namespace) = &config.namespace {
        request = request.header("x-reprise-namespace", namespace);
    }
    if let Some(value) = planned.item.cache_control {
        request = request.header("cache-control", value);
    }
    let started = Instant::now();
    let response = match request.send().await {
        Ok(r) => r,
        Err(err) => {
            sample.error = Some(err.to_string());
            sample.total_ms = ms(started.elapsed());
            return sample;
        }
    };
    sample.status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
    sample.outcome = outcome_of(header("x-reprise-cache"));
    sample.ttft_saved_ms = header("x-reprise-ttft-saved-ms").and_then(|v| v.trim().parse().ok());
    sample.similarity = header("x-reprise-similarity").and_then(|v| v.trim().parse().ok());
    sample.semantic_skipped = skipped_reason(header("x-reprise-semantic"));
    sample.phases = header("server-timing").and_then(Phases::from_server_timing);
    let text = |name: &str| {
        header(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    sample.entry = text("x-reprise-entry");
    sample.verified = text("x-reprise-verified");
    sample.verify = text("x-reprise-verify");
    sample.judge_ms = header("x-reprise-judge-ms").and_then(|v| v.trim().parse().ok());
    if !response.status().is_success() {
        sample.error = Some(format!("HTTP {}", sample.status));
        sample.total_ms = ms(started.elapsed());
        return sample;
    }
    if config.stream {
        let mut bytes = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut last_token: Option<Instant> = None;
        while let Some(chunk) = bytes.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(err) => {
                    sample.error = Some(err.to_string());
                    break;
                }
            };
            // Everything in one read arrived together: its tokens share one instant.
            let now = Instant::now();
            buffer.extend_from_slice(&chunk);
            // Whole lines only: an event may be split across reads.
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                if line.starts_with(b"data: ") && has_content(&line[6..]) {
                    sample.tokens += 1;
                    sample
                        .ttft_ms
                        .get_or_insert_with(|| ms(now.saturating_duration_since(started)));
                    if let Some(previous) = last_token {
                        sample
                            .gaps_ms
                            .push(ms(now.saturating_duration_since(previous)));
                    }
                    last_token = Some(now);
                } else if let Some(phases) = Phases::from_sse_line(&line) {
                    sample.phases = Some(phases);
                }
            }
        }
    } else {
        match response.bytes().await {
            Ok(_) => sample.ttft_ms = Some(ms(started.elapsed())),
            Err(err) => sample.error = Some(err.to_string()),
        }
    }
    sample.total_ms = ms(started.elapsed());
    sample
}

fn has_content(data: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return false;
    };
    value
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                c.pointer("/delta/content")
                    .or_else(|| c.get("text"))
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
        })
}

/// What the progress display hears about.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A request completed (or failed).
    Done(&'a Sample),
    /// An open-loop arrival was dropped at the in-flight cap.
    Dropped,
}

/// Called with every event of the measured run as it happens (progress display).
pub type Progress = Arc<dyn Fn(Event<'_>) + Send + Sync>;

fn lock(workload: &Mutex<Workload>) -> std::sync::MutexGuard<'_, Workload> {
    // A worker that panicked mid-draw leaves a usable workload: the draw is one step.
    workload
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the benchmark: the warm-up, then closed loop at the configured concurrency or open loop
/// at the configured rate, until `requests` were drawn or `max_duration` passed.
pub async fn run(config: BenchConfig, mut workload: Workload, progress: Progress) -> Report {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency.max(config.max_in_flight.min(256)) * 2)
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default();
    let run_started = httpdate::fmt_http_date(std::time::SystemTime::now());
    // Warm-up: open connections and let any lazy start-up happen off the record.
    // Numbered, so that with --round-robin every URL opens its connections here too.
    for (i, item) in workload
        .warmup(config.warmup, &config.run_id)
        .into_iter()
        .enumerate()
    {
        let planned = Planned {
            item,
            kind: Kind::New,
        };
        for t in 0..config.targets.len() {
            let _ = measure(&client, &config, t, i, &planned).await;
        }
    }
    let config = Arc::new(config);
    let description = workload.describe();
    let started = Instant::now();
    let (samples, open_loop, workload) = match config.rate {
        Some(rate) => {
            let (samples, stats) =
                openloop::run(&client, &config, rate, &mut workload, &progress).await;
            (samples, Some(stats), workload)
        }
        None => {
            let shared = Arc::new(Mutex::new(workload));
            let samples = closed_loop(&client, &config, &shared, &progress).await;
            let workload = lock(&shared).clone();
            (samples, None, workload)
        }
    };
    let mut report = summarize(&config, &samples, started.elapsed());
    let (new, repeat, paraphrase) = workload.counts();
    report.run.started = run_started;
    report.run.workload = description;
    report.run.constructed = [
        (Kind::New, new),
        (Kind::Repeat, repeat),
        (Kind::Paraphrase, paraphrase),
    ]
    .into_iter()
    .collect();
    report.open_loop = open_loop;
    report.samples = samples;
    report
}

async fn closed_loop(
    client: &reqwest::Client,
    config: &Arc<BenchConfig>,
    workload: &Arc<Mutex<Workload>>,
    progress: &Progress,
) -> Vec<Sample> {
    let deadline = Instant::now() + config.max_duration;
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1) {
        let (client, config, workload, progress) = (
            client.clone(),
            config.clone(),
            workload.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                // Draw under the lock, so request indices follow the draw order.
                let next = {
                    let mut w = lock(&workload);
                    (w.drawn() < config.requests && Instant::now() < deadline)
                        .then(|| (w.drawn(), w.next_planned()))
                };
                let Some((index, planned)) = next else { break };
                // Alternate which target goes first, so neither always gets the warmer moment.
                let n = config.targets.len();
                for k in 0..n {
                    let target = (index + k) % n;
                    let sample = measure(&client, &config, target, index, &planned).await;
                    progress(Event::Done(&sample));
                    samples.push(sample);
                }
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        if let Ok(mut s) = worker.await {
            samples.append(&mut s);
        }
    }
    samples
}

/// Milliseconds with a precision that suits their size.
pub(crate) fn fmt_ms(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A row of the terminal table: outcome, requests, TTFT, total and gap percentiles.
type Row<'a> = (
    String,
    usize,
    &'a Option<Percentiles>,
    &'a Option<Percentiles>,
    &'a Option<Percentiles>,
);

/// A plain-text table of the report.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let triple = |p: &Option<Percentiles>| match p {
        Some(p) => format!(
            "{:>8} {:>8} {:>8}",
            fmt_ms(p.p50),
            fmt_ms(p.p90),
            fmt_ms(p.p99)
        ),
        None => format!("{:>8} {:>8} {:>8}", "-", "-", "-"),
    };
    out.push_str(&format!(
        "{}; {}; {}\n",
        report.run.mode,
        if report.run.stream {
            "streaming"
        } else {
            "non-streaming"
        },
        report.run.workload
    ));
    if !report.run.constructed.is_empty() {
        let parts: Vec<String> = report
            .run
            .constructed
            .iter()
            .map(|(k, c)| format!("{c} {k}"))
            .collect();
        out.push_str(&format!("drawn by construction: {}\n", parts.join(", ")));
    }
    for (i, t) in report.targets.iter().enumerate() {
        out.push_str(&format!(
            "\n[{}] {}: {} requests, {} errors, {:.1} req/s\n",
            i + 1,
            t.url,
            t.requests,
            t.errors,
            t.requests_per_s
        ));
        out.push_str(&format!(
            "  {:<14} {:>6} {:>6}  {:>8} {:>8} {:>8}  {:>8} {:>8} {:>8}  {:>8} {:>8} {:>8}\n",
            "outcome",
            "reqs",
            "share",
            "ttft p50",
            "p90",
            "p99",
            "total p50",
            "p90",
            "p99",
            "itl p50",
            "p90",
            "p99"
        ));
        let ok: usize = t.outcomes.values().sum();
        let mut rows: Vec<Row<'_>> = t
            .by_outcome
            .iter()
            .map(|(o, s)| (o.clone(), s.count, &s.ttft_ms, &s.total_ms, &s.itl_ms))
            .collect();
        if t.by_outcome.len() > 1 {
            rows.push(("all".into(), ok, &t.ttft_ms, &t.total_ms, &t.itl_ms));
        }
        for (name, count, ttft, total, itl) in rows {
            out.push_str(&format!(
                "  {:<14} {:>6} {:>5.1}%  {}  {}  {}\n",
                name,
                count,
                count as f64 * 100.0 / ok.max(1) as f64,
                triple(ttft),
                triple(total),
                triple(itl)
            ));
        }
        if let Some(h) = &t.hit_rate {
            out.push_str(&format!(
                "  hit rate: exact {:.1}%, semantic {:.1}%, coalesced {:.1}%, served from cache {:.1}%; TTFT saved {:.2} s\n",
                h.exact * 100.0,
                h.semantic * 100.0,
                h.coalesced * 100.0,
                h.served * 100.0,
                t.ttft_saved_s
            ));
        }
        if t.hit_rate.is_some() {
            out.push_str(&format!("  {}\n", skipped_line(t)));
        }
        if let Some(x) = t.hit_speedup_p50 {
            out.push_str(&format!(
                "  hit TTFT speed-up (miss p50 / hit p50): {x:.0}x\n"
            ));
        }
        if let Some(s) = &t.similarity {
            out.push_str(&format!(
                "  semantic-hit similarity: p50 {:.3}, mean {:.3}\n",
                s.p50, s.mean
            ));
        }
        if t.by_construction.len() > 1 || t.by_construction.keys().any(|k| *k != Kind::New) {
            for (kind, outcomes) in &t.by_construction {
                let parts: Vec<String> = outcomes.iter().map(|(o, c)| format!("{o} {c}")).collect();
                out.push_str(&format!(
                    "  {:<12} -> {}\n",
                    kind.as_str(),
                    parts.join(", ")
                ));
            }
        }
        let timed: Vec<(&String, &PhaseMeans)> = t
            .by_outcome
            .iter()
            .filter_map(|(o, s)| s.phases.as_ref().map(|p| (o, p)))
            .collect();
        if !timed.is_empty() {
            out.push_str(&format!(
                "  gateway phases, mean ms: {:<12} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}\n",
                "outcome", "ingress", "lookup", "embed", "search", "send", "ttft", "decode", "down", "total"
            ));
            for (o, p) in timed {
                let cells: Vec<String> = p.mean_cells().iter().map(|c| format!("{c:>8}")).collect();
                out.push_str(&format!("  {:<24} {:<12} {}\n", "", o, cells.join(" ")));
            }
        }
    }
    if let Some(o) = &report.open_loop {
        out.push_str(&format!("\n{}\n", o.describe()));
    }
    if let Some(c) = &report.comparison {
        out.push('\n');
        if let Some(d) = &c.paired_ttft_diff_ms {
            out.push_str(&format!(
                "paired TTFT difference ([1] minus [2]), ms: p50 {}  p90 {}  p99 {}  mean {}\n",
                fmt_ms(d.p50),
                fmt_ms(d.p90),
                fmt_ms(d.p99),
                fmt_ms(d.mean)
            ));
        }
        let r = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
        out.push_str(&format!(
            "ratios [2] / [1]: TTFT p50 {}, TTFT p99 {}, total p50 {}, throughput {}\n",
            r(c.ttft_p50_ratio),
            r(c.ttft_p99_ratio),
            r(c.total_p50_ratio),
            r(c.throughput_ratio)
        ));
    }
    out.push_str(&format!("wall time: {:.2} s\n", report.wall_s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(target: usize, index: usize, ttft: f64, outcome: &str) -> Sample {
        let mut s = Sample::new(target, index, Kind::New);
        s.status = 200;
        s.outcome = outcome.to_owned();
        s.ttft_ms = Some(ttft);
        s.total_ms = ttft + 10.0;
        s.tokens = 3;
        s
    }

    pub(crate) fn test_config(targets: &[&str]) -> BenchConfig {
        BenchConfig {
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            round_robin: Vec::new(),
            api_key: String::new(),
            model: "m".into(),
            requests: 4,
            concurrency: 1,
            rate: None,
            arrivals: openloop::Arrivals::Uniform,
            seed: 1,
            max_in_flight: 8,
            stream: true,
            warmup: 0,
            run_id: "t".into(),
            max_duration: Duration::from_secs(1),
            namespace: None,
        }
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.5), Some(50.0));
        assert_eq!(percentile(&samples, 0.9), Some(90.0));
        assert_eq!(percentile(&samples, 0.99), Some(99.0));
        assert_eq!(percentile(&[3.0, 1.0], 0.5), Some(1.0));
        assert_eq!(percentile(&[3.0, 1.0], 0.99), Some(3.0));
        assert_eq!(percentile(&[], 0.5), None);
        let p = Percentiles::of(&[1.0, 2.0, 3.0, 10.0]).expect("some");
        assert_eq!((p.p50, p.p90, p.p99, p.mean), (2.0, 10.0, 10.0, 4.0));
    }

    #[test]
    fn ratios_need_a_positive_denominator() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
        assert_eq!(ratio(Some(f64::NAN), Some(1.0)), None);
    }

    #[test]
    fn outcomes_come_from_the_cache_header() {
        assert_eq!(outcome_of(Some("hit")), "hit");
        assert_eq!(outcome_of(Some(" Semantic-Hit ")), "semantic-hit");
        assert_eq!(outcome_of(Some("")), "none");
        assert_eq!(outcome_of(None), "none");
        let mut outcomes = BTreeMap::new();
        for (o, c) in [
            ("miss", 5),
            ("hit", 3),
            ("semantic-hit", 1),
            ("coalesced", 1),
        ] {
            outcomes.insert(o.to_owned(), c);
        }
        let h = HitRates::of(&outcomes).expect("gateway");
        assert_eq!((h.exact, h.semantic, h.coalesced), (0.3, 0.1, 0.1));
        assert!((h.served - 0.5).abs() < 1e-12);
        let direct: BTreeMap<String, usize> = [("none".to_owned(), 4)].into_iter().collect();
        assert_eq!(HitRates::of(&direct), None);
    }

    /// Issue 24: a run against a gateway that skipped matching for most misses said nothing of it.
    #[test]
    fn skipped_lookups_are_counted_by_reason() {
        assert_eq!(
            skipped_reason(Some("skipped; reason=overload")).as_deref(),
            Some("overload")
        );
        assert_eq!(skipped_reason(Some("skipped")).as_deref(), Some("unknown"));
        assert_eq!(skipped_reason(Some("on")), None);
        assert_eq!(skipped_reason(None), None);
        let config = test_config(&["http://a/v1"]);
        let mut samples: Vec<Sample> = (0..4).map(|i| sample(0, i, 10.0, "miss")).collect();
        samples.push(sample(0, 4, 1.0, "semantic-hit"));
        samples[0].semantic_skipped = Some("overload".into());
        samples[1].semantic_skipped = Some("overload".into());
        samples[2].semantic_skipped = Some("deadline".into());
        let report = summarize(&config, &samples, Duration::from_secs(1));
        let t = &report.targets[0];
        let expected: BTreeMap<String, usize> =
            [("deadline".to_owned(), 1), ("overload".to_owned(), 2)]
                .into_iter()
                .collect();
        assert_eq!(t.semantic_skipped, expected);
        assert_eq!(
            skipped_line(t),
            "semantic matching skipped: 3 of 4 misses (75.0%): deadline 1, overload 2"
        );
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["targets"][0]["semantic_skipped"]["overload"], 2);
        assert!(report::markdown(&report, &BTreeMap::new())
            .contains("Semantic matching skipped: 3 of 4"));
    }

    #[test]
    fn base_urls_get_v1_only_without_a_path() {
        let url = |s| base_url(s).expect("valid");
        assert_eq!(url("http://127.0.0.1:8080"), "http://127.0.0.1:8080/v1");
        assert_eq!(url("http://127.0.0.1:8080/"), "http://127.0.0.1:8080/v1");
        assert_eq!(url("http://127.0.0.1:8080/v1/"), "http://127.0.0.1:8080/v1");
        assert_eq!(
            url("https://peer.example/openai/v1"),
            "https://peer.example/openai/v1"
        );
        assert!(base_url("127.0.0.1:8080").is_err());
        assert!(base_url("ftp://x").is_err());
    }

    #[test]
    fn percentiles_and_paired_differences() {
        let config = test_config(&["a", "b"]);
        let mut samples = Vec::new();
        for i in 0..4 {
            samples.push(sample(0, i, 101.0 + i as f64, "miss"));
            samples.push(sample(1, i, 100.0 + i as f64, "none"));
        }
        let mut failed = sample(0, 9, 1.0, "miss");
        failed.error = Some("boom".into());
        samples.push(failed);
        let report = summarize(&config, &samples, Duration::from_secs(2));
        assert_eq!(report.targets[0].requests, 5);
        assert_eq!(report.targets[0].errors, 1);
        assert_eq!(report.targets[0].outcomes.get("miss"), Some(&4));
        assert_eq!(report.targets[0].by_outcome["miss"].count, 4);
        assert_eq!(
            report.targets[1].by_outcome["none"]
                .ttft_ms
                .as_ref()
                .map(|p| p.p50),
            Some(101.0)
        );
        let ttft = report.targets[0].ttft_ms.clone().expect("ttft");
        assert_eq!((ttft.p50, ttft.p99), (102.0, 104.0));
        assert_eq!(report.targets[0].requests_per_s, 2.0);
        let comparison = report.comparison.clone().expect("comparison");
        let diff = comparison.paired_ttft_diff_ms.expect("diff");
        assert_eq!((diff.p50, diff.p99, diff.mean), (1.0, 1.0, 1.0));
        assert_eq!(comparison.ttft_p50_ratio, Some(101.0 / 102.0));
        assert_eq!(comparison.ttft_p99_ratio, Some(103.0 / 104.0));
        // Closed loop at concurrency 1: 1 / mean total time (ms -> s).
        let rate = |t: usize| report.targets[t].service_rate_per_s.expect("rate");
        assert!((rate(0) - 1000.0 / 112.5).abs() < 1e-9);
        assert_eq!(comparison.throughput_ratio, Some(rate(1) / rate(0)));
        assert_eq!(report.targets[1].hit_rate, None);
        let text = render(&report);
        assert!(text.contains("paired TTFT difference"), "{text}");
        assert!(text.contains("ratios [2] / [1]"), "{text}");
    }

    #[test]
    fn outcomes_are_counted_by_construction_and_by_header() {
        let config = test_config(&["a"]);
        let mut samples = vec![
            sample(0, 0, 400.0, "miss"),
            sample(0, 1, 400.0, "miss"),
            sample(0, 2, 0.5, "hit"),
            sample(0, 3, 0.5, "hit"),
            sample(0, 4, 7.0, "semantic-hit"),
            sample(0, 5, 0.5, "coalesced"),
        ];
        samples[2].kind = Kind::Repeat;
        samples[3].kind = Kind::Repeat;
        samples[4].kind = Kind::Paraphrase;
        samples[4].similarity = Some(0.93);
        samples[1].kind = Kind::Paraphrase;
        samples[2].ttft_saved_ms = Some(399.5);
        samples[3].ttft_saved_ms = Some(400.5);
        samples[0].gaps_ms = vec![1.0, 3.0];
        let report = summarize(&config, &samples, Duration::from_secs(1));
        assert_eq!(report.run.mode, "closed loop, concurrency 1");
        let poisson = BenchConfig {
            rate: Some(8.0),
            arrivals: openloop::Arrivals::Poisson,
            ..test_config(&["a"])
        };
        assert_eq!(
            summarize(&poisson, &samples, Duration::from_secs(1))
                .run
                .mode,
            "open loop, Poisson arrivals at 8 requests/s (seed 1), at most 8 in flight"
        );
        let t = &report.targets[0];
        assert_eq!(t.hit_speedup_p50, Some(800.0));
        assert_eq!(t.ttft_saved_s, 0.8);
        assert_eq!(t.by_construction[&Kind::Repeat]["hit"], 2);
        assert_eq!(t.by_construction[&Kind::Paraphrase]["miss"], 1);
        assert_eq!(t.by_construction[&Kind::Paraphrase]["semantic-hit"], 1);
        assert_eq!(t.by_construction[&Kind::New].values().sum::<usize>(), 2);
        let h = t.hit_rate.clone().expect("rates");
        assert!((h.served - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(t.similarity.as_ref().map(|s| s.p50), Some(0.93));
        assert_eq!(
            t.by_outcome["miss"].itl_ms.as_ref().map(|p| p.p99),
            Some(3.0)
        );
    }

    #[test]
    fn content_detection_ignores_role_and_finish_chunks() {
        assert!(has_content(br#"{"choices":[{"delta":{"content":"x"}}]}"#));
        assert!(!has_content(
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!has_content(b"[DONE]"));
        assert!(has_content(br#"{"choices":[{"text":"x"}]}"#));
    }

    #[test]
    fn cycled_prompts_repeat_and_bodies_carry_the_model() {
        let config = test_config(&["a"]);
        let mut w = Workload::cycle("t", 2);
        let drawn: Vec<Planned> = (0..4).map(|_| w.next_planned()).collect();
        assert_eq!(drawn[3].item, drawn[1].item);
        assert_ne!(drawn[2].item, drawn[1].item);
        assert_eq!(drawn[3].kind, Kind::Repeat);
        let b = body(&config, &drawn[0].item);
        assert_eq!(b["model"], "m");
        assert_eq!(b["stream"], true);
        assert_eq!(b["messages"][0]["role"], "user");
    }
}
