//! The statistics of a run: nearest-rank percentiles, per-target and per-outcome summaries, hit
//! rates, the paired comparison of two targets, and the [`Report`] that holds them. Pure functions
//! of the samples: the runner measures, `table.rs` and `report.rs` render.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::openloop;
use super::timing::PhaseMeans;
use super::workload::Kind;
use super::{BenchConfig, Sample};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::{sample, test_config};
    use crate::bench::{outcome_of, render, report, skipped_line, skipped_reason};
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
}
