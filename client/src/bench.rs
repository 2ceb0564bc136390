//! The benchmark driver: sends chat completions to one or two OpenAI-compatible base URLs and measures
//! what an application feels (client-side time to first token, inter-token gaps, total time).
//!
//! With a second URL (`--compare`) every prompt is sent to both, back to back and in alternating
//! order, so the two are measured side by side in one run on the same machine state; the report then
//! gives each one's percentiles and the paired differences (e.g. the gateway's added latency).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

/// What to send and how.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Base URLs including `/v1`: the target, and optionally a second one measured alongside.
    pub targets: Vec<String>,
    pub api_key: String,
    pub model: String,
    pub requests: usize,
    pub concurrency: usize,
    pub stream: bool,
    /// Requests per target sent first and left out of the results (connection set-up, warm caches).
    pub warmup: usize,
    /// Distinguishes this run's prompts from any earlier run's, so a cache cannot serve them.
    pub run_id: String,
    /// Upper bound on the whole run.
    pub max_duration: Duration,
    /// Cycle over this many distinct prompts (request i sends prompt i mod N), so later passes can
    /// be served from a cache; `None`: every request is a new prompt.
    pub unique_prompts: Option<usize>,
    /// Explicit prompts, sent in order (request i sends prompt i mod len); overrides the generated ones.
    pub prompts: Option<Arc<Vec<String>>>,
}

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub target: usize,
    pub index: usize,
    pub status: u16,
    /// `x-reprise-cache` as the gateway sent it, `none` without the header.
    pub outcome: String,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub tokens: usize,
    pub error: Option<String>,
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
}

#[derive(Debug, Clone, Serialize)]
pub struct TargetSummary {
    pub url: String,
    pub requests: usize,
    pub errors: usize,
    pub outcomes: BTreeMap<String, usize>,
    pub by_outcome: BTreeMap<String, OutcomeSummary>,
    /// Miss TTFT p50 divided by hit TTFT p50, when both were seen.
    pub hit_speedup_p50: Option<f64>,
    pub ttft_ms: Option<Percentiles>,
    pub total_ms: Option<Percentiles>,
    pub requests_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Percentiles of target-0 minus target-1 TTFT over the same prompt (paired).
    pub paired_ttft_diff_ms: Option<Percentiles>,
    /// Target-1 TTFT p50 divided by target-0 TTFT p50.
    pub ttft_p50_ratio: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub targets: Vec<TargetSummary>,
    pub comparison: Option<Comparison>,
    pub wall_s: f64,
}

/// Summarizes samples per target, and pairs them by prompt when there are two targets.
pub fn summarize(config: &BenchConfig, samples: &[Sample], wall: Duration) -> Report {
    let targets = config
        .targets
        .iter()
        .enumerate()
        .map(|(t, url)| {
            let mine: Vec<&Sample> = samples.iter().filter(|s| s.target == t).collect();
            let ok: Vec<&&Sample> = mine.iter().filter(|s| s.error.is_none()).collect();
            let mut outcomes = BTreeMap::new();
            for s in &ok {
                *outcomes.entry(s.outcome.clone()).or_insert(0) += 1;
            }
            let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft_ms).collect();
            let total: Vec<f64> = ok.iter().map(|s| s.total_ms).collect();
            let by_outcome: BTreeMap<String, OutcomeSummary> = outcomes
                .iter()
                .map(|(outcome, count)| {
                    let of: Vec<&Sample> = ok
                        .iter()
                        .filter(|s| &s.outcome == outcome)
                        .map(|s| **s)
                        .collect();
                    let ttft: Vec<f64> = of.iter().filter_map(|s| s.ttft_ms).collect();
                    let total: Vec<f64> = of.iter().map(|s| s.total_ms).collect();
                    let summary = OutcomeSummary {
                        count: *count,
                        ttft_ms: Percentiles::of(&ttft),
                        total_ms: Percentiles::of(&total),
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
            let hit_p50 = p50("hit").or(p50("semantic-hit"));
            let hit_speedup_p50 = match (p50("miss"), hit_p50) {
                (Some(miss), Some(hit)) if hit > 0.0 => Some(miss / hit),
                _ => None,
            };
            TargetSummary {
                url: url.clone(),
                requests: mine.len(),
                errors: mine.len() - ok.len(),
                outcomes,
                by_outcome,
                hit_speedup_p50,
                ttft_ms: Percentiles::of(&ttft),
                total_ms: Percentiles::of(&total),
                requests_per_s: ok.len() as f64 / wall.as_secs_f64().max(1e-9),
            }
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
        let ratio = match (&targets[0].ttft_ms, &targets[1].ttft_ms) {
            (Some(x), Some(y)) if x.p50 > 0.0 => Some(y.p50 / x.p50),
            _ => None,
        };
        Comparison {
            paired_ttft_diff_ms: Percentiles::of(&diffs),
            ttft_p50_ratio: ratio,
        }
    });
    Report {
        targets,
        comparison,
        wall_s: wall.as_secs_f64(),
    }
}

fn prompt(config: &BenchConfig, index: usize) -> Value {
    if let Some(prompts) = config.prompts.as_ref().filter(|p| !p.is_empty()) {
        return json!({
            "model": config.model,
            "stream": config.stream,
            "messages": [{"role": "user", "content": prompts[index % prompts.len()]}]
        });
    }
    let index = config.unique_prompts.map_or(index, |n| index % n.max(1));
    json!({
        "model": config.model,
        "stream": config.stream,
        "messages": [{"role": "user", "content": generated_prompt(&config.run_id, index)}]
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
) -> Sample {
    let body = prompt(config, index);
    let started = Instant::now();
    let mut sample = Sample {
        target,
        index,
        status: 0,
        outcome: "none".to_owned(),
        ttft_ms: None,
        total_ms: 0.0,
        tokens: 0,
        error: None,
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let response = client
        .post(format!("{}/chat/completions", config.targets[target]))
        .bearer_auth(&config.api_key)
        .json(&body)
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        Err(err) => {
            sample.error = Some(err.to_string());
            sample.total_ms = ms(started.elapsed());
            return sample;
        }
    };
    sample.status = response.status().as_u16();
    if let Some(cache) = response
        .headers()
        .get("x-reprise-cache")
        .and_then(|v| v.to_str().ok())
    {
        sample.outcome = cache.to_owned();
    }
    if !response.status().is_success() {
        sample.error = Some(format!("HTTP {}", sample.status));
        sample.total_ms = ms(started.elapsed());
        return sample;
    }
    if config.stream {
        let mut bytes = response.bytes_stream();
        let mut buffer = Vec::new();
        while let Some(chunk) = bytes.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(err) => {
                    sample.error = Some(err.to_string());
                    break;
                }
            };
            buffer.extend_from_slice(&chunk);
            // Count content deltas in whole lines only.
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                if line.starts_with(b"data: ") && has_content(&line[6..]) {
                    sample.tokens += 1;
                    sample.ttft_ms.get_or_insert_with(|| ms(started.elapsed()));
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

/// Runs the benchmark closed-loop at the configured concurrency; `progress` is called per request.
pub async fn run(config: BenchConfig, progress: impl Fn(usize) + Send + Sync + 'static) -> Report {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency * 2)
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default();
    // Warm-up: open connections and let any lazy start-up happen off the record.
    for i in 0..config.warmup {
        // With a fixed prompt set the warm-up walks it (priming a cache); otherwise it uses
        // prompts the measured requests never send.
        let index = if config.unique_prompts.is_some() || config.prompts.is_some() {
            i
        } else {
            usize::MAX - i
        };
        for t in 0..config.targets.len() {
            let _ = measure(&client, &config, t, index).await;
        }
    }
    let config = Arc::new(config);
    let next = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(progress);
    let started = Instant::now();
    let deadline = started + config.max_duration;
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1) {
        let (client, config, next, progress) = (
            client.clone(),
            config.clone(),
            next.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= config.requests || Instant::now() >= deadline {
                    break;
                }
                // Alternate which target goes first, so neither always gets the warmer moment.
                let n = config.targets.len();
                for k in 0..n {
                    let target = (index + k) % n;
                    samples.push(measure(&client, &config, target, index).await);
                }
                progress(index + 1);
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
    summarize(&config, &samples, started.elapsed())
}

/// A plain-text table of the report.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let fmt = |p: &Option<Percentiles>| match p {
        Some(p) => format!("{:>9.3} {:>9.3} {:>9.3}", p.p50, p.p90, p.p99),
        None => format!("{:>9} {:>9} {:>9}", "-", "-", "-"),
    };
    out.push_str(&format!(
        "{:<40} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}\n",
        "target", "reqs", "errors", "ttft p50", "p90", "p99", "total p50", "p90", "p99", "req/s"
    ));
    for t in &report.targets {
        out.push_str(&format!(
            "{:<40} {:>6} {:>6} {} {} {:>8.1}\n",
            t.url,
            t.requests,
            t.errors,
            fmt(&t.ttft_ms),
            fmt(&t.total_ms),
            t.requests_per_s
        ));
        for (outcome, o) in &t.by_outcome {
            out.push_str(&format!(
                "{:<40} {:>6} {:>6} {} {}\n",
                format!("  {outcome}"),
                o.count,
                "",
                fmt(&o.ttft_ms),
                fmt(&o.total_ms),
            ));
        }
        if let Some(x) = t.hit_speedup_p50 {
            out.push_str(&format!(
                "  hit TTFT speed-up (miss p50 / hit p50): {x:.0}x\n"
            ));
        }
    }
    if let Some(c) = &report.comparison {
        if let Some(d) = &c.paired_ttft_diff_ms {
            out.push_str(&format!(
                "paired TTFT difference (first minus second), ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  mean {:.3}\n",
                d.p50, d.p90, d.p99, d.mean
            ));
        }
        if let Some(r) = c.ttft_p50_ratio {
            out.push_str(&format!("TTFT p50 ratio (second / first): {r:.3}\n"));
        }
    }
    out.push_str(&format!("wall time: {:.2} s\n", report.wall_s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(target: usize, index: usize, ttft: f64, outcome: &str) -> Sample {
        Sample {
            target,
            index,
            status: 200,
            outcome: outcome.to_owned(),
            ttft_ms: Some(ttft),
            total_ms: ttft + 10.0,
            tokens: 3,
            error: None,
        }
    }

    pub(super) fn test_config(targets: &[&str], unique_prompts: Option<usize>) -> BenchConfig {
        BenchConfig {
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            api_key: String::new(),
            model: "m".into(),
            requests: 4,
            concurrency: 1,
            stream: true,
            warmup: 0,
            run_id: "t".into(),
            max_duration: Duration::from_secs(1),
            unique_prompts,
            prompts: None,
        }
    }

    #[test]
    fn percentiles_and_paired_differences() {
        let config = test_config(&["a", "b"], None);
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
        let diff = report
            .comparison
            .clone()
            .expect("comparison")
            .paired_ttft_diff_ms
            .expect("diff");
        assert_eq!((diff.p50, diff.p99, diff.mean), (1.0, 1.0, 1.0));
        assert!(render(&report).contains("paired TTFT difference"));
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
}

#[cfg(test)]
mod outcome_tests {
    use super::*;

    #[test]
    fn hit_speedup_is_miss_p50_over_hit_p50() {
        let config = super::tests::test_config(&["a"], Some(2));
        let mk = |index, ttft, outcome: &str| Sample {
            target: 0,
            index,
            status: 200,
            outcome: outcome.into(),
            ttft_ms: Some(ttft),
            total_ms: ttft,
            tokens: 1,
            error: None,
        };
        let samples = vec![
            mk(0, 400.0, "miss"),
            mk(1, 400.0, "miss"),
            mk(2, 0.5, "hit"),
            mk(3, 0.5, "hit"),
        ];
        let report = summarize(&config, &samples, Duration::from_secs(1));
        assert_eq!(report.targets[0].hit_speedup_p50, Some(800.0));
        // Request 3 sends prompt 1 again.
        assert_eq!(prompt(&config, 3), prompt(&config, 1));
        assert_ne!(prompt(&config, 2), prompt(&config, 1));
    }
}
