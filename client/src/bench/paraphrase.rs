//! The paraphrase workload (`bench --pairs FILE`, issue 19): labeled pairs (the eval's JSON Lines,
//! `a`, `b`, `same_answer`) measure what a verify stage does over replayed traffic. Every `a` is
//! stored first (`Cache-Control: no-cache`, so each is an entry of its own even when it is a near
//! match of another), then every `b` is asked once per round, in one namespace, so that the error
//! budget sees every verdict.
//!
//! Each `b` is asked with `Cache-Control: no-store`: the cache holds only the `a` entries, so a
//! later round's `b` can only be served from an `a` (by an approval the judge gave, by the error
//! budget or by the threshold), never as an exact hit of its own earlier answer. That is what
//! measures promotion; an exact repeat would count answers the verify stage had no part in.
//!
//! Served answers are attributed by `x-reprise-entry`: the entry ids of the `a` prompts are read
//! back after seeding, and a served `b` is right when the labels pair it with that entry's `a` as
//! `same`. Judge calls per lookup come from the gateway's `/admin/stats` `judge` counters, read
//! before and after each slice of a round; in async mode the slice ends only once the background
//! queue is empty and every queued pair has its verdict. This module must not send anything the
//! labels do not describe, and never reads a verdict from the gateway other than through stats.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::workload::{Item, Kind, Planned};
use super::{fmt_ms, measure, BenchConfig, Event, Percentiles, Progress, Sample};
use crate::admin::{AdminClient, JudgeStats};
use crate::eval::pairs::{Pair, Prompt};

/// What the paraphrase workload sends.
#[derive(Debug, Clone)]
pub struct Spec {
    pub pairs: Vec<Pair>,
    /// Times every `b` is asked (at least 1).
    pub rounds: usize,
    /// Each round is cut into this many slices, with the judge's counters read after each.
    pub segments: usize,
    /// The gateways' admin token, for `/admin/stats`.
    pub admin_token: Option<String>,
    /// Longest wait for a background judge queue to empty after a slice.
    pub drain_timeout: Duration,
}

/// The pairs as sent: the distinct `a` prompts and, per pair, which of them it asks against.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Distinct `a` prompts, in order of first appearance.
    pub seeds: Vec<Prompt>,
    pub asks: Vec<PlannedAsk>,
    /// (seed, `b` as sent) -> whether the seed's answer answers it, from every labeled pair.
    labels: HashMap<(usize, String), bool>,
    /// Each seed as sent, to recognize a `b` that is another pair's `a` word for word.
    seed_keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct PlannedAsk {
    /// The index of its `a` in `seeds`.
    pub seed: usize,
    pub b: Prompt,
    pub same_answer: bool,
}

/// How a served answer relates to the question asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truth {
    /// Served from an `a` the labels pair with this `b` as `same`.
    Right,
    /// Served from an `a` the labels pair with this `b` as a trap.
    Wrong,
    /// Served from an entry the labels say nothing about with this `b` (another pair's `a`).
    Unlabeled,
}

fn key_of(prompt: &Prompt) -> String {
    serde_json::Value::Array(prompt.messages()).to_string()
}

impl Plan {
    pub fn new(pairs: &[Pair]) -> Self {
        let mut seeds = Vec::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut asks = Vec::new();
        let mut labels = HashMap::new();
        let mut seed_keys = Vec::new();
        for pair in pairs {
            let seed = *seen.entry(key_of(&pair.a)).or_insert_with(|| {
                seeds.push(pair.a.clone());
                seed_keys.push(key_of(&pair.a));
                seeds.len() - 1
            });
            // A pair labeled both ways is a trap: serving it is not known to be right.
            labels
                .entry((seed, key_of(&pair.b)))
                .and_modify(|same: &mut bool| *same &= pair.same_answer)
                .or_insert(pair.same_answer);
            asks.push(PlannedAsk {
                seed,
                b: pair.b.clone(),
                same_answer: pair.same_answer,
            });
        }
        Self {
            seeds,
            asks,
            labels,
            seed_keys,
        }
    }

    /// What serving ask `ask` from the entry of seed `seed` (`None`: an entry that is no seed's) is.
    pub fn truth(&self, ask: usize, seed: Option<usize>) -> Truth {
        let b = key_of(&self.asks[ask].b);
        // A `b` that is another pair's `a` word for word gets that question's own answer.
        if seed.is_some_and(|s| self.seed_keys.get(s) == Some(&b)) {
            return Truth::Right;
        }
        match seed.and_then(|s| self.labels.get(&(s, b))) {
            Some(true) => Truth::Right,
            Some(false) => Truth::Wrong,
            None => Truth::Unlabeled,
        }
    }

    /// The asks of slice `segment` of `segments` (contiguous, in file order).
    pub fn slice(&self, segment: usize, segments: usize) -> std::ops::Range<usize> {
        let n = self.asks.len();
        let segments = segments.clamp(1, n.max(1));
        (segment * n / segments)..((segment + 1) * n / segments)
    }
}

/// One `b` asked of one target.
#[derive(Debug, Clone)]
pub struct Asked {
    pub ask: usize,
    pub round: usize,
    pub segment: usize,
    pub sample: Sample,
}

/// The judge's counters over one slice (after minus before).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct JudgeDelta {
    pub calls: u64,
    pub same: u64,
    pub different: u64,
    pub unsure: u64,
    pub over_budget: u64,
    pub queued: u64,
    pub dropped: u64,
}

impl JudgeDelta {
    pub fn between(before: &JudgeStats, after: &JudgeStats) -> Self {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        Self {
            calls: d(before.calls, after.calls),
            same: d(before.same, after.same),
            different: d(before.different, after.different),
            unsure: d(before.unsure, after.unsure),
            over_budget: d(before.over_budget, after.over_budget),
            queued: d(before.queued, after.queued),
            dropped: d(before.dropped, after.dropped),
        }
    }

    fn add(&mut self, other: &Self) {
        self.calls += other.calls;
        self.same += other.same;
        self.different += other.different;
        self.unsure += other.unsure;
        self.over_budget += other.over_budget;
        self.queued += other.queued;
        self.dropped += other.dropped;
    }
}

/// Whether every pair queued for a background verdict has one (or was not judged).
pub fn settled(stats: &JudgeStats) -> bool {
    stats.queue_depth == 0 && stats.calls + stats.over_budget + stats.too_long >= stats.queued
}

/// The figures of one target over a round, a slice of one, or the whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `None`: every round.
    pub round: Option<usize>,
    /// `None`: the whole round.
    pub segment: Option<usize>,
    pub target: usize,
    pub lookups: usize,
    pub errors: usize,
    pub should_hit: usize,
    /// Should-hit `b` served with a right answer.
    pub should_hit_served: usize,
    pub traps: usize,
    /// Trap `b` served an answer the labels call wrong (its own `a`'s, or another `a` labeled a
    /// trap with it). One served from an `a` the labels say nothing about is in `served_unlabeled`:
    /// other pairs' `a` include paraphrases of its own, whose answer may well be right.
    pub traps_served: usize,
    /// Served answers the labels call wrong, and those from an entry they do not pair with the `b`.
    pub served_wrong: usize,
    pub served_unlabeled: usize,
    /// Semantic hits by `x-reprise-verified`.
    pub verified_judge: usize,
    pub verified_budget: usize,
    /// `None` when the target's `/admin/stats` had no judge (or could not be read).
    pub judge: Option<JudgeDelta>,
    pub judge_calls_per_lookup: Option<f64>,
    pub miss_ttft_ms: Option<Percentiles>,
    /// Misses that waited for a judge call (sync mode: `x-reprise-verify` is the verdict).
    pub judged_miss_ttft_ms: Option<Percentiles>,
    /// Semantic hits with `x-reprise-verified: judge`.
    pub verified_hit_ttft_ms: Option<Percentiles>,
}

/// Whether a request waited for a judge's answer: its `x-reprise-verify` is a verdict the judge
/// gave (or a timeout), not `queued`, `dropped` or a candidate that was never sent to it.
pub fn waited_for_judge(s: &Sample) -> bool {
    let Some(v) = s.verify.as_deref() else {
        return false;
    };
    let verdict = v.split(';').next().unwrap_or("").trim();
    match verdict {
        "same" | "different" => true,
        "unsure" => !["over_budget", "too_long", "not_configured"]
            .iter()
            .any(|r| v.contains(r)),
        _ => false,
    }
}

fn served(outcome: &str) -> bool {
    matches!(outcome, "hit" | "semantic-hit" | "coalesced")
}

/// Summarizes the asks of one target (already filtered to a round or slice).
pub fn row(
    plan: &Plan,
    entries: &HashMap<String, usize>,
    asked: &[&Asked],
    (round, segment, target): (Option<usize>, Option<usize>, usize),
    judge: Option<JudgeDelta>,
) -> Row {
    let ok: Vec<&&Asked> = asked.iter().filter(|a| a.sample.error.is_none()).collect();
    let mut r = Row {
        round,
        segment,
        target,
        lookups: ok.len(),
        errors: asked.len() - ok.len(),
        should_hit: 0,
        should_hit_served: 0,
        traps: 0,
        traps_served: 0,
        served_wrong: 0,
        served_unlabeled: 0,
        verified_judge: 0,
        verified_budget: 0,
        judge_calls_per_lookup: judge
            .as_ref()
            .filter(|_| !ok.is_empty())
            .map(|j| j.calls as f64 / ok.len() as f64),
        judge,
        miss_ttft_ms: None,
        judged_miss_ttft_ms: None,
        verified_hit_ttft_ms: None,
    };
    let (mut miss, mut judged_miss, mut verified) = (Vec::new(), Vec::new(), Vec::new());
    for a in &ok {
        let s = &a.sample;
        let same = plan.asks[a.ask].same_answer;
        if same {
            r.should_hit += 1;
        } else {
            r.traps += 1;
        }
        if s.outcome == "miss" {
            miss.extend(s.ttft_ms);
            if waited_for_judge(s) {
                judged_miss.extend(s.ttft_ms);
            }
        }
        if !served(&s.outcome) {
            continue;
        }
        match s.verified.as_deref() {
            Some("judge") => {
                r.verified_judge += 1;
                verified.extend(s.ttft_ms);
            }
            Some("budget") => r.verified_budget += 1,
            _ => {}
        }
        let seed = s.entry.as_ref().and_then(|e| entries.get(e)).copied();
        match plan.truth(a.ask, seed) {
            Truth::Right => r.should_hit_served += usize::from(same),
            Truth::Wrong => {
                r.served_wrong += 1;
                r.traps_served += usize::from(!same);
            }
            Truth::Unlabeled => r.served_unlabeled += 1,
        }
    }
    r.miss_ttft_ms = Percentiles::of(&miss);
    r.judged_miss_ttft_ms = Percentiles::of(&judged_miss);
    r.verified_hit_ttft_ms = Percentiles::of(&verified);
    r
}

/// What later rounds served of the `b` that round 1 did not serve, on one target.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Promotion {
    pub round: usize,
    pub target: usize,
    /// Should-hit `b` not served right in round 1, and of those served right in this round.
    pub should_hit_missed: usize,
    pub should_hit_promoted: usize,
    /// Trap `b` not served a wrong answer in round 1, and of those served one in this round.
    pub traps_missed: usize,
    pub traps_promoted: usize,
}

/// Promotions of every later round on every target.
pub fn promotions(
    plan: &Plan,
    entries: &[HashMap<String, usize>],
    asked: &[Asked],
    rounds: usize,
) -> Vec<Promotion> {
    // (target, round, ask) -> served right / served wrong.
    let mut right = HashMap::new();
    let mut wrong = HashMap::new();
    for a in asked.iter().filter(|a| a.sample.error.is_none()) {
        let s = &a.sample;
        let key = (s.target, a.round, a.ask);
        let is_served = served(&s.outcome);
        let seed = s
            .entry
            .as_ref()
            .and_then(|e| entries.get(s.target)?.get(e))
            .copied();
        let truth = plan.truth(a.ask, seed);
        wrong.insert(key, is_served && truth == Truth::Wrong);
        right.insert(key, is_served && truth == Truth::Right);
    }
    let mut out = Vec::new();
    for target in 0..entries.len() {
        for round in 2..=rounds {
            let mut p = Promotion {
                round,
                target,
                should_hit_missed: 0,
                should_hit_promoted: 0,
                traps_missed: 0,
                traps_promoted: 0,
            };
            for (i, ask) in plan.asks.iter().enumerate() {
                let seen = if ask.same_answer { &right } else { &wrong };
                // Not asked (or failed) in either round: nothing to compare.
                let (Some(&was), Some(&now)) =
                    (seen.get(&(target, 1, i)), seen.get(&(target, round, i)))
                else {
                    continue;
                };
                if was {
                    continue;
                }
                if ask.same_answer {
                    p.should_hit_missed += 1;
                    p.should_hit_promoted += usize::from(now);
                } else {
                    p.traps_missed += 1;
                    p.traps_promoted += usize::from(now);
                }
            }
            out.push(p);
        }
    }
    out
}

/// Misses of the first target against the second on the same `b` in the same round.
#[derive(Debug, Clone, Serialize)]
pub struct MissPair {
    /// `None`: every round.
    pub round: Option<usize>,
    /// `b` that missed on both.
    pub pairs: usize,
    /// First target's TTFT minus the second's, per `b`.
    pub diff_ms: Option<Percentiles>,
}

pub fn miss_pairs(asked: &[Asked], round: Option<usize>) -> MissPair {
    let misses = |t: usize| -> HashMap<(usize, usize), f64> {
        asked
            .iter()
            .filter(|a| a.sample.target == t && round.is_none_or(|r| a.round == r))
            .filter(|a| a.sample.error.is_none() && a.sample.outcome == "miss")
            .filter_map(|a| a.sample.ttft_ms.map(|v| ((a.round, a.ask), v)))
            .collect()
    };
    let (first, second) = (misses(0), misses(1));
    let diffs: Vec<f64> = first
        .iter()
        .filter_map(|(k, v)| second.get(k).map(|w| v - w))
        .collect();
    MissPair {
        round,
        pairs: diffs.len(),
        diff_ms: Percentiles::of(&diffs),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started: String,
    pub mode: String,
    pub namespace: Option<String>,
    pub targets: Vec<String>,
    pub pairs: usize,
    pub seeds: usize,
    pub should_hit: usize,
    pub traps: usize,
    pub rounds: usize,
    pub segments: usize,
    /// Per round and target.
    pub by_round: Vec<Row>,
    /// Per round, slice and target (only with more than one slice).
    pub by_segment: Vec<Row>,
    /// Every round, per target.
    pub overall: Vec<Row>,
    /// With two targets: per round, then every round.
    pub misses_side_by_side: Vec<MissPair>,
    /// Per later round and target: what round 1 left unserved and this round served.
    pub promotions: Vec<Promotion>,
    pub wall_s: f64,
    #[serde(skip)]
    pub samples: Vec<Asked>,
}

/// Builds the report from what was sent and measured; `judge[t][(round, segment)]` are the deltas.
pub fn summarize(
    plan: &Plan,
    spec: &Spec,
    targets: &[String],
    entries: &[HashMap<String, usize>],
    asked: Vec<Asked>,
    judge: &[BTreeMap<(usize, usize), JudgeDelta>],
) -> Report {
    let segments = spec.segments.clamp(1, plan.asks.len().max(1));
    let mut by_round = Vec::new();
    let mut by_segment = Vec::new();
    let mut overall = Vec::new();
    for (t, seeded) in entries.iter().enumerate().take(targets.len()) {
        let mine: Vec<&Asked> = asked.iter().filter(|a| a.sample.target == t).collect();
        let sum = |f: &dyn Fn(&(usize, usize)) -> bool| -> Option<JudgeDelta> {
            let deltas = judge.get(t)?;
            let mut total: Option<JudgeDelta> = None;
            for (_, d) in deltas.iter().filter(|(k, _)| f(k)) {
                total.get_or_insert_with(JudgeDelta::default).add(d);
            }
            total
        };
        for round in 1..=spec.rounds {
            let of_round: Vec<&Asked> = mine.iter().filter(|a| a.round == round).copied().collect();
            if segments > 1 {
                for segment in 0..segments {
                    let of: Vec<&Asked> = of_round
                        .iter()
                        .filter(|a| a.segment == segment)
                        .copied()
                        .collect();
                    let delta = judge.get(t).and_then(|d| d.get(&(round, segment)).cloned());
                    by_segment.push(row(
                        plan,
                        seeded,
                        &of,
                        (Some(round), Some(segment), t),
                        delta,
                    ));
                }
            }
            let delta = sum(&|(r, _)| *r == round);
            by_round.push(row(plan, seeded, &of_round, (Some(round), None, t), delta));
        }
        overall.push(row(plan, seeded, &mine, (None, None, t), sum(&|_| true)));
    }
    by_round.sort_by_key(|r| (r.round, r.target));
    by_segment.sort_by_key(|r| (r.round, r.segment, r.target));
    let misses_side_by_side = if targets.len() == 2 {
        (1..=spec.rounds)
            .map(Some)
            .chain(std::iter::once(None))
            .map(|r| miss_pairs(&asked, r))
            .collect()
    } else {
        Vec::new()
    };
    let promotions = promotions(plan, entries, &asked, spec.rounds);
    Report {
        started: String::new(),
        mode: String::new(),
        namespace: None,
        targets: targets.to_vec(),
        pairs: plan.asks.len(),
        seeds: plan.seeds.len(),
        should_hit: plan.asks.iter().filter(|a| a.same_answer).count(),
        traps: plan.asks.iter().filter(|a| !a.same_answer).count(),
        rounds: spec.rounds,
        segments,
        by_round,
        by_segment,
        overall,
        misses_side_by_side,
        promotions,
        wall_s: 0.0,
        samples: asked,
    }
}

fn share(n: usize, of: usize) -> String {
    if of == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}% ({n}/{of})", n as f64 * 100.0 / of as f64)
    }
}

fn p50_p99(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{} / {}", fmt_ms(p.p50), fmt_ms(p.p99)),
        None => "-".to_owned(),
    }
}

fn table(out: &mut String, rows: &[Row]) {
    out.push_str("| round | slice | target | lookups | should-hit served | traps served wrong | wrong / unlabeled served | judge calls | calls per lookup | served by judge / budget | miss TTFT p50 / p99 ms | judged miss TTFT p50 / p99 | verified hit TTFT p50 / p99 |\n");
    out.push_str("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in rows {
        let judge = r.judge.as_ref().map_or("-".to_owned(), |j| {
            let mut s = format!(
                "{} (same {}, different {}, unsure {})",
                j.calls, j.same, j.different, j.unsure
            );
            if j.over_budget + j.dropped > 0 {
                s.push_str(&format!(
                    "; over budget {}, dropped {}",
                    j.over_budget, j.dropped
                ));
            }
            s
        });
        let errors = if r.errors > 0 {
            format!(" ({} errors)", r.errors)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "| {} | {} | [{}] | {}{} | {} | {} | {} / {} | {} | {} | {} / {} | {} | {} | {} |\n",
            r.round.map_or("all".to_owned(), |v| v.to_string()),
            r.segment.map_or("all".to_owned(), |v| (v + 1).to_string()),
            r.target + 1,
            r.lookups,
            errors,
            share(r.should_hit_served, r.should_hit),
            share(r.traps_served, r.traps),
            r.served_wrong,
            r.served_unlabeled,
            judge,
            r.judge_calls_per_lookup
                .map_or("-".to_owned(), |v| format!("{v:.3}")),
            r.verified_judge,
            r.verified_budget,
            p50_p99(&r.miss_ttft_ms),
            p50_p99(&r.judged_miss_ttft_ms),
            p50_p99(&r.verified_hit_ttft_ms),
        ));
    }
}

/// The report as Markdown (also what the terminal shows).
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{}; paraphrase workload: {} pairs ({} should-hit, {} traps) against {} stored `a` prompts, every `b` asked {} times (Cache-Control: no-store)\n\n",
        report.mode, report.pairs, report.should_hit, report.traps, report.seeds, report.rounds
    ));
    for (i, t) in report.targets.iter().enumerate() {
        out.push_str(&format!("- [{}] {t}\n", i + 1));
    }
    out.push('\n');
    table(&mut out, &report.by_round);
    if !report.by_segment.is_empty() {
        out.push_str("\nBy slice of each round (the judge's counters read after each):\n\n");
        table(&mut out, &report.by_segment);
    }
    if !report.promotions.is_empty() {
        out.push_str("\nPromotion: of the should-hit `b` round 1 did not serve right, those this round did (traps: served wrong):\n\n");
        out.push_str(
            "| round | target | should-hit promoted | traps promoted |\n|---|---|---:|---:|\n",
        );
        for p in &report.promotions {
            out.push_str(&format!(
                "| {} | [{}] | {} | {} |\n",
                p.round,
                p.target + 1,
                share(p.should_hit_promoted, p.should_hit_missed),
                share(p.traps_promoted, p.traps_missed)
            ));
        }
    }
    out.push_str("\nEvery round:\n\n");
    table(&mut out, &report.overall);
    if !report.misses_side_by_side.is_empty() {
        out.push_str("\nMisses side by side ([1] minus [2] TTFT on the same `b` in the same round, where both missed):\n\n");
        out.push_str("| round | `b` missed on both | p50 ms | p90 ms | p99 ms | mean ms |\n|---|---:|---:|---:|---:|---:|\n");
        for m in &report.misses_side_by_side {
            let cells = m.diff_ms.as_ref().map_or(
                [
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                    "-".to_owned(),
                ],
                |d| [fmt_ms(d.p50), fmt_ms(d.p90), fmt_ms(d.p99), fmt_ms(d.mean)],
            );
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                m.round.map_or("all".to_owned(), |r| r.to_string()),
                m.pairs,
                cells.join(" | ")
            ));
        }
    }
    out.push_str(&format!("\nwall time: {:.2} s\n", report.wall_s));
    out
}

/// One request to send: the item, its sample index and the targets, in the order to send it.
struct Job {
    index: usize,
    planned: Planned,
    targets: Vec<usize>,
}

/// Sends every job with `concurrency` workers; a worker sends one job to its targets in turn.
async fn send_all(
    client: &reqwest::Client,
    config: &Arc<BenchConfig>,
    jobs: Vec<Job>,
    progress: Option<&Progress>,
) -> Vec<(usize, Sample)> {
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let out = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1).min(jobs.len().max(1)) {
        let (client, config, jobs, next, out) = (
            client.clone(),
            config.clone(),
            jobs.clone(),
            next.clone(),
            out.clone(),
        );
        let progress = progress.cloned();
        workers.push(tokio::spawn(async move {
            loop {
                let at = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(at) else { break };
                for &t in &job.targets {
                    let sample = measure(&client, &config, t, job.index, &job.planned).await;
                    if let Some(p) = &progress {
                        p(Event::Done(&sample));
                    }
                    out.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((at, sample));
                }
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
    let mut out = std::mem::take(&mut *out.lock().unwrap_or_else(|e| e.into_inner()));
    out.sort_by_key(|(at, s)| (*at, s.target));
    out
}

/// Alternates which target goes first, so neither always gets the warmer moment.
fn order(index: usize, n: usize) -> Vec<usize> {
    (0..n).map(|k| (index + k) % n).collect()
}

fn item_of(prompt: &Prompt, cache_control: &'static str) -> Item {
    Item {
        messages: Arc::new(serde_json::Value::Array(prompt.messages())),
        model: None,
        group: None,
        weight: 1.0,
        cache_control: Some(cache_control),
    }
}

async fn judge_stats(admin: &Option<AdminClient>) -> Option<JudgeStats> {
    admin.as_ref()?.stats().await.ok()?.judge
}

/// Reads the judge's counters once the background queue has settled (or `timeout` passed).
async fn settled_stats(admin: &Option<AdminClient>, timeout: Duration) -> Option<JudgeStats> {
    let deadline = Instant::now() + timeout;
    loop {
        let stats = judge_stats(admin).await?;
        if settled(&stats) {
            // A verdict is counted just before it is kept: give the keeping a moment.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return judge_stats(admin).await;
        }
        if Instant::now() >= deadline {
            return Some(stats);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the paraphrase workload against every target of `config` (the first is usually the
/// gateway with a verify stage, the second, `--compare`, one without).
pub async fn run(config: BenchConfig, spec: Spec, progress: Progress) -> Result<Report, String> {
    if spec.pairs.is_empty() {
        return Err("the pairs file has no pairs".into());
    }
    let plan = Plan::new(&spec.pairs);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency.max(1) * 2)
        .tcp_nodelay(true)
        .build()
        .map_err(|e| e.to_string())?;
    let n = config.targets.len();
    let admins: Vec<Option<AdminClient>> = config
        .targets
        .iter()
        .map(|u| AdminClient::new(u, spec.admin_token.as_deref()).ok())
        .collect();
    if judge_stats(&admins[0]).await.is_none() {
        return Err(format!(
            "{}: no judge counters in /admin/stats (not a gateway with verify, or a wrong --admin-token); judge calls per lookup cannot be measured",
            config.targets[0]
        ));
    }
    let run_started = httpdate::fmt_http_date(std::time::SystemTime::now());
    let config = Arc::new(config);
    let started = Instant::now();

    // 1. Store every `a`, each as an entry of its own.
    let jobs = plan
        .seeds
        .iter()
        .enumerate()
        .map(|(i, a)| Job {
            index: i,
            planned: Planned {
                item: item_of(a, "no-cache"),
                kind: Kind::New,
            },
            targets: order(i, n),
        })
        .collect();
    let seeded = send_all(&client, &config, jobs, None).await;
    if let Some((_, s)) = seeded.iter().find(|(_, s)| s.error.is_some()) {
        return Err(format!(
            "storing a: {} on [{}]",
            s.error.as_deref().unwrap_or(""),
            s.target + 1
        ));
    }

    // 2. Read each `a`'s entry id back from its exact hit (the writer stores in the background).
    let mut entries: Vec<HashMap<String, usize>> = vec![HashMap::new(); n];
    let mut found: Vec<Vec<bool>> = vec![vec![false; plan.seeds.len()]; n];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let jobs: Vec<Job> = (0..plan.seeds.len())
            .filter_map(|i| {
                let targets: Vec<usize> =
                    order(i, n).into_iter().filter(|t| !found[*t][i]).collect();
                (!targets.is_empty()).then(|| Job {
                    index: i,
                    planned: Planned {
                        item: item_of(&plan.seeds[i], "no-store"),
                        kind: Kind::Repeat,
                    },
                    targets,
                })
            })
            .collect();
        if jobs.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} stored a prompts were not served as exact hits within 30 s",
                jobs.len()
            ));
        }
        for (i, s) in send_all(&client, &config, jobs, None).await {
            if let (Some(entry), "hit") = (&s.entry, s.outcome.as_str()) {
                entries[s.target].insert(entry.clone(), i);
                found[s.target][i] = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 3. Every `b`, once per round, slice by slice, the judge's counters read around each slice.
    let segments = spec.segments.clamp(1, plan.asks.len());
    let mut asked = Vec::new();
    let mut judge: Vec<BTreeMap<(usize, usize), JudgeDelta>> = vec![BTreeMap::new(); n];
    for round in 1..=spec.rounds.max(1) {
        for segment in 0..segments {
            let range = plan.slice(segment, segments);
            let mut before = Vec::new();
            for admin in &admins {
                before.push(judge_stats(admin).await);
            }
            let jobs = range
                .clone()
                .map(|i| {
                    let index = (round - 1) * plan.asks.len() + i;
                    Job {
                        index,
                        planned: Planned {
                            item: item_of(&plan.asks[i].b, "no-store"),
                            kind: if round == 1 {
                                Kind::Paraphrase
                            } else {
                                Kind::Repeat
                            },
                        },
                        targets: order(index, n),
                    }
                })
                .collect();
            for (at, sample) in send_all(&client, &config, jobs, Some(&progress)).await {
                asked.push(Asked {
                    ask: range.start + at,
                    round,
                    segment,
                    sample,
                });
            }
            for (t, admin) in admins.iter().enumerate() {
                let after = settled_stats(admin, spec.drain_timeout).await;
                if let (Some(b), Some(a)) = (&before[t], &after) {
                    judge[t].insert((round, segment), JudgeDelta::between(b, a));
                }
            }
        }
    }
    let wall = started.elapsed();
    let spec = Spec {
        rounds: spec.rounds.max(1),
        ..spec
    };
    let mut report = summarize(&plan, &spec, &config.targets, &entries, asked, &judge);
    report.started = run_started;
    report.mode = format!("closed loop, concurrency {}", config.concurrency.max(1));
    report.namespace = config.namespace.clone();
    report.wall_s = wall.as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::pairs::{parse, Ambiguous};

    const PAIRS: &str = concat!(
        "{\"a\": \"How do I boil an egg?\", \"b\": \"What is the way to boil an egg?\", \"same_answer\": true}\n",
        "{\"a\": \"How do I boil an egg?\", \"b\": \"How do I poach an egg?\", \"same_answer\": false}\n",
        "{\"a\": \"USD to EUR rate\", \"b\": \"EUR to USD rate\", \"same_answer\": false}\n",
        "{\"a\": \"Capital of France?\", \"b\": \"What is France's capital?\", \"same_answer\": true}\n",
    );

    fn plan() -> Plan {
        Plan::new(&parse("p.jsonl", PAIRS, Ambiguous::Different).expect("pairs"))
    }

    fn spec(rounds: usize, segments: usize) -> Spec {
        Spec {
            pairs: Vec::new(),
            rounds,
            segments,
            admin_token: None,
            drain_timeout: Duration::from_secs(1),
        }
    }

    /// A served or missed `b`: `entry` names the serving entry.
    fn asked(
        ask: usize,
        round: usize,
        target: usize,
        outcome: &str,
        entry: Option<&str>,
        ttft: f64,
    ) -> Asked {
        let mut sample = Sample::new(target, ask, Kind::Paraphrase);
        sample.status = 200;
        sample.outcome = outcome.to_owned();
        sample.entry = entry.map(str::to_owned);
        sample.ttft_ms = Some(ttft);
        Asked {
            ask,
            round,
            segment: 0,
            sample,
        }
    }

    #[test]
    fn a_prompts_are_stored_once_and_labels_decide_truth() {
        let p = plan();
        assert_eq!(p.seeds.len(), 3, "the shared `a` is one entry");
        assert_eq!(
            p.asks.iter().map(|a| a.seed).collect::<Vec<_>>(),
            [0, 0, 1, 2]
        );
        assert_eq!(p.truth(0, Some(0)), Truth::Right);
        assert_eq!(p.truth(1, Some(0)), Truth::Wrong);
        // Served from another pair's `a`: the labels do not say, so it is not counted as right.
        assert_eq!(p.truth(0, Some(2)), Truth::Unlabeled);
        assert_eq!(p.truth(3, None), Truth::Unlabeled);
        // A trap `b` that is another pair's `a`: that entry's answer is its own.
        let echo = concat!(
            "{\"a\": \"Cancel my plan\", \"b\": \"Do not cancel my plan\", \"same_answer\": false}\n",
            "{\"a\": \"Do not cancel my plan\", \"b\": \"Keep my plan\", \"same_answer\": true}\n"
        );
        let p3 = Plan::new(&parse("e", echo, Ambiguous::Different).expect("pairs"));
        assert_eq!(p3.truth(0, Some(1)), Truth::Right);
        assert_eq!(p3.truth(0, Some(0)), Truth::Wrong);
        // A pair labeled both ways is not known to be right.
        let twice = concat!(
            "{\"a\": \"x\", \"b\": \"y\", \"same_answer\": true}\n",
            "{\"a\": \"x\", \"b\": \"y\", \"same_answer\": false}\n"
        );
        let p2 = Plan::new(&parse("t", twice, Ambiguous::Different).expect("pairs"));
        assert_eq!(p2.truth(0, Some(0)), Truth::Wrong);
    }

    #[test]
    fn slices_cover_every_ask_once() {
        let p = plan();
        let ranges: Vec<_> = (0..3).map(|s| p.slice(s, 3)).collect();
        assert_eq!(ranges, [0..1, 1..2, 2..4]);
        assert_eq!(p.slice(0, 1), 0..4);
        // More slices than asks: one ask each.
        assert_eq!(p.slice(3, 9), 3..4);
    }

    #[test]
    fn a_background_queue_settles_when_every_queued_pair_has_a_verdict() {
        let mut s = JudgeStats {
            queued: 5,
            calls: 3,
            over_budget: 1,
            ..JudgeStats::default()
        };
        assert!(!settled(&s));
        s.too_long = 1;
        assert!(settled(&s));
        s.queue_depth = 1;
        assert!(!settled(&s), "a pair still waiting");
        let before = JudgeStats {
            calls: 10,
            same: 6,
            different: 4,
            queued: 10,
            ..JudgeStats::default()
        };
        let after = JudgeStats {
            calls: 13,
            same: 7,
            different: 5,
            unsure: 1,
            queued: 14,
            dropped: 2,
            ..JudgeStats::default()
        };
        let d = JudgeDelta::between(&before, &after);
        assert_eq!(
            d,
            JudgeDelta {
                calls: 3,
                same: 1,
                different: 1,
                unsure: 1,
                over_budget: 0,
                queued: 4,
                dropped: 2
            }
        );
    }

    #[test]
    fn rows_count_served_answers_by_label_and_judge_calls_per_lookup() {
        let p = plan();
        let entries: HashMap<String, usize> = [("e_a", 0), ("e_b", 1), ("e_c", 2)]
            .into_iter()
            .map(|(e, i)| (e.to_owned(), i))
            .collect();
        let mut verified = asked(0, 2, 0, "semantic-hit", Some("e_a"), 3.0);
        verified.sample.verified = Some("judge".into());
        let mut budget = asked(3, 2, 0, "semantic-hit", Some("e_b"), 4.0);
        budget.sample.verified = Some("budget".into());
        let mut judged_miss = asked(2, 2, 0, "miss", None, 450.0);
        judged_miss.sample.verify = Some("different".into());
        let mut failed = asked(1, 2, 0, "none", None, 1.0);
        failed.sample.error = Some("HTTP 502".into());
        let all = [
            verified,
            // A trap served from its own `a`: wrong.
            asked(1, 2, 0, "semantic-hit", Some("e_a"), 5.0),
            judged_miss,
            // A should-hit `b` served from another pair's `a`: not right.
            budget,
            failed,
        ];
        let refs: Vec<&Asked> = all.iter().collect();
        let judge = JudgeDelta {
            calls: 2,
            ..JudgeDelta::default()
        };
        let r = row(&p, &entries, &refs, (Some(2), None, 0), Some(judge));
        assert_eq!((r.lookups, r.errors), (4, 1));
        assert_eq!((r.should_hit, r.should_hit_served), (2, 1));
        assert_eq!((r.traps, r.traps_served), (2, 1));
        assert_eq!((r.served_wrong, r.served_unlabeled), (1, 1));
        assert_eq!((r.verified_judge, r.verified_budget), (1, 1));
        assert_eq!(r.judge_calls_per_lookup, Some(0.5));
        assert_eq!(r.miss_ttft_ms.as_ref().map(|m| m.p50), Some(450.0));
        assert_eq!(r.judged_miss_ttft_ms.as_ref().map(|m| m.p99), Some(450.0));
        assert_eq!(r.verified_hit_ttft_ms.as_ref().map(|m| m.p50), Some(3.0));
        // Without judge counters there is no rate.
        let r = row(&p, &entries, &refs, (Some(2), None, 0), None);
        assert_eq!(r.judge_calls_per_lookup, None);
    }

    #[test]
    fn the_report_pairs_misses_and_sums_slices_into_rounds() {
        let p = plan();
        let served_by_a: HashMap<String, usize> = [("e_a".to_owned(), 0)].into_iter().collect();
        let entries = vec![served_by_a, HashMap::new()];
        let mut all = Vec::new();
        for round in 1..=2 {
            for ask in 0..4 {
                // [1] is 10 ms slower on every miss of round 1; in round 2 [1] serves ask 0.
                if round == 2 && ask == 0 {
                    all.push(asked(ask, round, 0, "semantic-hit", Some("e_a"), 2.0));
                } else {
                    all.push(asked(ask, round, 0, "miss", None, 310.0 + ask as f64));
                }
                all.push(asked(ask, round, 1, "miss", None, 300.0 + ask as f64));
            }
        }
        for a in &mut all {
            a.segment = usize::from(a.ask >= 2);
        }
        let judge: BTreeMap<(usize, usize), JudgeDelta> =
            [((1, 0), 2), ((1, 1), 2), ((2, 0), 0), ((2, 1), 1)]
                .into_iter()
                .map(|(k, calls)| {
                    (
                        k,
                        JudgeDelta {
                            calls,
                            ..JudgeDelta::default()
                        },
                    )
                })
                .collect();
        let targets = vec!["http://a/v1".to_owned(), "http://b/v1".to_owned()];
        let report = summarize(&p, &spec(2, 2), &targets, &entries, all, &[judge]);
        let first: Vec<Option<f64>> = report
            .by_round
            .iter()
            .filter(|r| r.target == 0)
            .map(|r| r.judge_calls_per_lookup)
            .collect();
        assert_eq!(first, [Some(1.0), Some(0.25)]);
        // The second target had no counters.
        assert!(report
            .by_round
            .iter()
            .filter(|r| r.target == 1)
            .all(|r| r.judge.is_none()));
        assert_eq!(report.by_segment.len(), 2 * 2 * 2);
        assert_eq!(report.overall[0].judge.as_ref().map(|j| j.calls), Some(5));
        let m1 = &report.misses_side_by_side[0];
        assert_eq!((m1.round, m1.pairs), (Some(1), 4));
        assert_eq!(m1.diff_ms.as_ref().map(|d| d.p50), Some(10.0));
        let all_rounds = report.misses_side_by_side.last().expect("all");
        assert_eq!((all_rounds.round, all_rounds.pairs), (None, 7));
        let text = render(&report);
        assert!(text.contains("| 2 | all | [1] | 4 | 50.0% (1/2)"), "{text}");
        assert!(text.contains("| 1 | 4 | 10.00 |"), "{text}");
        assert!(text.contains("By slice of each round"), "{text}");
        let promoted = |t: usize| {
            report
                .promotions
                .iter()
                .find(|p| p.target == t && p.round == 2)
                .cloned()
                .expect("round 2")
        };
        let first = promoted(0);
        assert_eq!((first.should_hit_missed, first.should_hit_promoted), (2, 1));
        assert_eq!((first.traps_missed, first.traps_promoted), (2, 0));
        assert_eq!(promoted(1).should_hit_promoted, 0);
        assert!(
            text.contains("| 2 | [1] | 50.0% (1/2) | 0.0% (0/2) |"),
            "{text}"
        );
    }

    #[test]
    fn only_a_judge_answer_counts_as_a_wait() {
        let with = |v: Option<&str>| {
            let mut s = Sample::new(0, 0, Kind::Paraphrase);
            s.verify = v.map(str::to_owned);
            waited_for_judge(&s)
        };
        assert!(with(Some("different")));
        assert!(with(Some("same")));
        assert!(with(Some("unsure; reason=timeout")));
        assert!(!with(Some("unsure; reason=over_budget")));
        assert!(!with(Some("unsure; reason=too_long")));
        assert!(!with(Some("queued")));
        assert!(!with(Some("dropped")));
        assert!(!with(None));
    }
}
