//! The report of an evaluation: a [`Summary`] of the recorded outcomes, printed as a plain-text
//! table, written as Markdown (`eval.md`), JSON Lines (`results.jsonl`) and the threshold curve.
//!
//! Categories are listed weakest first: should-hit categories by the share served (lowest first),
//! then trap categories by the share served (highest first), so the README can quote the top rows.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::score::{self, Best, Observed, Point, Scored, Tally};
use super::verify::{self, Spread, VerifyTally};
use super::{Evaluation, PairResult};

/// Wrong-answer budgets the report finds the best threshold for.
pub const BUDGETS: [f64; 2] = [0.01, 0.05];

/// Thresholds listed in the sweep table (the gateway's own is added).
const TABLE_THRESHOLDS: [f64; 12] = [
    0.70, 0.75, 0.80, 0.85, 0.88, 0.90, 0.92, 0.94, 0.95, 0.96, 0.98, 1.00,
];

/// A category's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub name: String,
    #[serde(flatten)]
    pub tally: Tally,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub title: String,
    pub url: String,
    pub run_id: String,
    pub gateway_version: Option<String>,
    pub threshold: f64,
    /// The gateway's literal guards, when it reports them.
    pub guards: Option<String>,
    pub wall_s: f64,
    pub fallbacks_during_run: u64,
    /// Lookups that skipped semantic matching (`x-reprise-semantic: skipped`), each asked again.
    pub skipped_lookups: usize,
    /// Pairs whose every lookup of `b` was skipped: left out of the figures, not errors.
    pub skipped_pairs: usize,
    /// At the gateway's own decisions.
    pub overall: Tally,
    /// Weakest first (see the module comment).
    pub categories: Vec<Group>,
    /// By input file, when there are several.
    pub sources: Vec<Group>,
    /// The sweep at the table thresholds and the gateway's.
    pub sweep: Vec<Point>,
    /// Best threshold per budget, `None` when no threshold meets it.
    pub best: Vec<(f64, Option<Best>)>,
    /// The first few failed pairs, with why.
    pub failures: Vec<String>,
    /// What the gateway's verify stage did, when any lookup showed it (`None`: no judge activity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyFigures>,
}

/// The verify figures overall and per group, the groups in the order of the category table.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyFigures {
    pub overall: VerifyTally,
    pub categories: Vec<VerifyGroup>,
    pub sources: Vec<VerifyGroup>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyGroup {
    pub name: String,
    #[serde(flatten)]
    pub tally: VerifyTally,
}

impl VerifyFigures {
    fn of(results: &[PairResult], categories: &[Group], sources: &[Group]) -> Option<Self> {
        if !results.iter().any(verify::active) {
            return None;
        }
        let by = |groups: &[Group], key: fn(&PairResult) -> &str| -> Vec<VerifyGroup> {
            groups
                .iter()
                .map(|g| VerifyGroup {
                    name: g.name.clone(),
                    tally: verify::tally(results.iter().filter(|r| key(r) == g.name)),
                })
                .collect()
        };
        Some(Self {
            overall: verify::tally(results),
            categories: by(categories, |r| &r.category),
            sources: by(sources, |r| &r.source),
        })
    }
}

fn observed(r: &PairResult) -> Option<Observed> {
    r.measured().then_some(Observed {
        same_answer: r.same_answer,
        served: r.served,
        no_candidate: r.similarity.is_none(),
        guarded: r.guard.is_some(),
    })
}

/// Computes the figures of an evaluation.
pub fn summarize(evaluation: &Evaluation, title: &str) -> Summary {
    let results = &evaluation.results;
    let mut overall = Tally::default();
    let mut skipped_pairs = 0;
    for r in results {
        match observed(r) {
            Some(o) => overall.add(o),
            None if r.error.is_none() => skipped_pairs += 1,
            None => overall.errors += 1,
        }
    }
    let mut categories = groups(score::tally_by(results, |r| r.category.clone(), observed));
    categories.sort_by(|x, y| weakness(&x.tally).total_cmp(&weakness(&y.tally)));
    let by_source = score::tally_by(results, |r| r.source.clone(), observed);
    let sources = if by_source.len() > 1 {
        groups(by_source)
    } else {
        Vec::new()
    };
    let verify = VerifyFigures::of(results, &categories, &sources);
    let scored: Vec<Scored> = results.iter().filter_map(PairResult::scored).collect();
    let mut thresholds = TABLE_THRESHOLDS.to_vec();
    thresholds.push(evaluation.gateway.threshold);
    thresholds.sort_by(f64::total_cmp);
    thresholds.dedup();
    Summary {
        title: title.to_owned(),
        url: evaluation.url.clone(),
        run_id: evaluation.run_id.clone(),
        gateway_version: evaluation.gateway.version.clone(),
        threshold: evaluation.gateway.threshold,
        guards: evaluation.gateway.guards.clone(),
        wall_s: evaluation.wall_s,
        fallbacks_during_run: evaluation.fallbacks_during_run,
        skipped_lookups: results.iter().map(|r| r.skipped_lookups).sum(),
        skipped_pairs,
        overall,
        categories,
        sources,
        sweep: score::sweep(&scored, &thresholds),
        best: BUDGETS
            .iter()
            .map(|b| (*b, score::best_within(&scored, *b)))
            .collect(),
        failures: results
            .iter()
            .filter_map(|r| {
                r.error
                    .as_ref()
                    .map(|e| format!("{} ({}:{}): {e}", r.id, r.source, r.line))
            })
            .take(10)
            .collect(),
        verify,
    }
}

fn groups(map: BTreeMap<String, Tally>) -> Vec<Group> {
    map.into_iter()
        .map(|(name, tally)| Group { name, tally })
        .collect()
}

/// Sort key, lowest = weakest: should-hit categories by their share served (0..1), then mixed
/// ones, then trap categories by their share *not* served (2..3).
fn weakness(t: &Tally) -> f64 {
    match (t.hit_share(), t.trap_share()) {
        (Some(hit), None) => hit,
        (None, Some(wrong)) => 2.0 + (1.0 - wrong),
        (Some(_), Some(_)) => 1.5,
        (None, None) => 4.0,
    }
}

/// One row of the category table, in column order: pairs, should-hit served, traps served, error
/// rate, no candidate, guarded. The text and Markdown tables lay out the same cells.
fn tally_cells(t: &Tally) -> [String; 6] {
    [
        t.pairs.to_string(),
        count(t.should_hit_served, t.should_hit),
        count(t.traps_served, t.traps),
        pct(t.error_rate()),
        t.no_candidate.to_string(),
        t.guarded.to_string(),
    ]
}

/// The verify columns of a row: verified hits (how many by budget), judge calls per lookup.
fn verify_cells(v: &VerifyTally) -> [String; 2] {
    let verified = match v.verified_by_budget {
        0 => v.verified_hits().to_string(),
        budget => format!("{} ({budget} budget)", v.verified_hits()),
    };
    let calls = v.calls_per_lookup().map_or_else(
        || "-".to_owned(),
        |c| format!("{c:.2} ({}/{})", v.judge_calls, v.lookups),
    );
    [verified, calls]
}

/// The verify cells of the group `name` (empty cells when no verify figures exist).
fn verify_row(groups: &[VerifyGroup], name: &str) -> Option<[String; 2]> {
    groups
        .iter()
        .find(|g| g.name == name)
        .map(|g| verify_cells(&g.tally))
}

/// `p50 / p99 ms (n)`, or `-` without samples.
fn spread(s: &Spread) -> String {
    match (s.p50_ms, s.p99_ms) {
        (Some(p50), Some(p99)) => format!("{p50:.1} / {p99:.1} ({})", s.n),
        _ => "-".to_owned(),
    }
}

/// The latency rows of the verify stage: (name, judge, verified-hit TTFT, other hits' TTFT, verdicts).
fn verify_latency_rows(v: &VerifyFigures) -> Vec<[String; 5]> {
    let row = |name: &str, t: &VerifyTally| {
        let mut verdicts = format!("{} / {} / {}", t.same, t.different, t.unsure);
        if t.not_asked > 0 {
            verdicts.push_str(&format!("; not asked {}", t.not_asked));
        }
        if t.queued + t.dropped > 0 {
            verdicts.push_str(&format!("; queued {}, dropped {}", t.queued, t.dropped));
        }
        [
            name.to_owned(),
            spread(&t.judge),
            spread(&t.verified_hit_ttft),
            spread(&t.unverified_hit_ttft),
            verdicts,
        ]
    };
    std::iter::once(row("overall", &v.overall))
        .chain(v.categories.iter().map(|g| row(&g.name, &g.tally)))
        .collect()
}

/// What the latency table's columns mean, in the text and Markdown reports alike.
const VERIFY_NOTE: &str = "Verify stage, from each lookup's `x-reprise-verified`, `x-reprise-verify` \
    and `Server-Timing: judge`: verified hits are served semantic hits the judge vetted on that \
    request or the entry's error budget let through; judge calls/lookup counts lookups on which the \
    judge gave a verdict, over lookups measured. Latency, p50 / p99 ms (samples): the judge's own \
    time; the time to the response head of a hit the judge vetted; the same for semantic hits \
    served without a judge call. Verdicts: same / different / unsure (then `unsure` without a \
    judge call: rate budget spent, prompt too long, no judge configured).";

fn pct(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0))
}

fn count(part: usize, whole: usize) -> String {
    if whole == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1}% ({part}/{whole})",
            part as f64 * 100.0 / whole as f64
        )
    }
}

/// A sentence for each budget's best threshold.
fn best_lines(summary: &Summary) -> Vec<String> {
    let o = &summary.overall;
    if o.pairs > 0 && o.no_candidate == o.pairs {
        return vec![
            "no pair found a candidate in its partition, so no threshold serves anything: there is no best threshold"
                .to_owned(),
        ];
    }
    summary
        .best
        .iter()
        .map(|(budget, best)| match best {
            Some(b) => format!(
                "wrong ≤ {:.0}%: best should-hit share {:.1}% at threshold {:.4} (traps served {:.1}%)",
                budget * 100.0,
                b.hit_share * 100.0,
                b.threshold,
                b.trap_share * 100.0
            ),
            None => format!(
                "wrong ≤ {:.0}%: no threshold keeps the traps served within the budget",
                budget * 100.0
            ),
        })
        .collect()
}

/// The plain-text table printed by `reprise-client eval`.
pub fn render_text(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", summary.title);
    let _ = writeln!(
        out,
        "gateway {} (threshold {:.4}, guards {}), {} pairs in {:.1} s",
        summary.url,
        summary.threshold,
        summary.guards.as_deref().unwrap_or("none"),
        summary.overall.pairs + summary.overall.errors,
        summary.wall_s
    );
    let _ = writeln!(out);
    let mut header = format!(
        "{:<32} {:>6} {:>22} {:>22} {:>10} {:>12} {:>8}",
        "category",
        "pairs",
        "should-hit served",
        "traps served (wrong)",
        "error rate",
        "no candidate",
        "guarded"
    );
    let v = summary.verify.as_ref();
    if v.is_some() {
        let _ = write!(
            header,
            " {:>18} {:>20}",
            "verified hits", "judge calls/lookup"
        );
    }
    let _ = writeln!(out, "{header}");
    let row = |out: &mut String, name: &str, t: &Tally, verify: Option<[String; 2]>| {
        let [pairs, served, traps, error, none, guarded] = tally_cells(t);
        let _ = write!(
            out,
            "{name:<32} {pairs:>6} {served:>22} {traps:>22} {error:>10} {none:>12} {guarded:>8}"
        );
        if let Some([verified, calls]) = verify {
            let _ = write!(out, " {verified:>18} {calls:>20}");
        }
        let _ = writeln!(out);
    };
    row(
        &mut out,
        "overall",
        &summary.overall,
        v.map(|v| verify_cells(&v.overall)),
    );
    for g in &summary.categories {
        let cells = v.and_then(|v| verify_row(&v.categories, &g.name));
        row(&mut out, &format!("  {}", g.name), &g.tally, cells);
    }
    for g in &summary.sources {
        let cells = v.and_then(|v| verify_row(&v.sources, &g.name));
        row(&mut out, &format!("  file {}", g.name), &g.tally, cells);
    }
    if let Some(v) = v {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<32} {:>20} {:>20} {:>20}  verdicts",
            "verify stage", "judge", "verified hit TTFT", "other hits TTFT"
        );
        for [name, judge, verified, other, verdicts] in verify_latency_rows(v) {
            let name = if name == "overall" {
                name
            } else {
                format!("  {name}")
            };
            let _ = writeln!(
                out,
                "{name:<32} {judge:>20} {verified:>20} {other:>20}  {verdicts}"
            );
        }
        let _ = writeln!(out, "{VERIFY_NOTE}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "threshold sweep (from the recorded similarities; exact hits are served at any threshold, guarded pairs at none):"
    );
    let _ = writeln!(
        out,
        "{:>10} {:>18} {:>21} {:>11}",
        "threshold", "should-hit served", "traps served (wrong)", "error rate"
    );
    for p in &summary.sweep {
        let mark = if (p.threshold - summary.threshold).abs() < 1e-9 {
            "  <- gateway"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "{:>10.2} {:>18} {:>21} {:>11}{mark}",
            p.threshold,
            pct(p.hit_share),
            pct(p.trap_share),
            pct(p.error_rate)
        );
    }
    let _ = writeln!(out);
    for line in best_lines(summary) {
        let _ = writeln!(out, "{line}");
    }
    write_warnings(&mut out, summary, "");
    out
}

/// How many lookups the gateway skipped, in the text and Markdown reports alike.
pub fn skipped_line(summary: &Summary) -> String {
    format!(
        "Skipped lookups (`x-reprise-semantic: skipped`, asked again): {}; pairs never matched and left out: {}.",
        summary.skipped_lookups, summary.skipped_pairs
    )
}

fn write_warnings(out: &mut String, summary: &Summary, prefix: &str) {
    let _ = writeln!(out, "{prefix}{}", skipped_line(summary));
    if summary.overall.errors > 0 {
        let _ = writeln!(
            out,
            "{prefix}{} pairs could not be measured and are left out; first failures:",
            summary.overall.errors
        );
        for f in &summary.failures {
            let _ = writeln!(out, "{prefix}  {f}");
        }
    }
    if summary.fallbacks_during_run > 0 {
        let _ = writeln!(
            out,
            "{prefix}warning: the gateway counted {} embedding fallbacks during the run (late or failed embeddings): those requests were matched exactly only",
            summary.fallbacks_during_run
        );
    }
}

/// `eval.md`: the same figures as Markdown, with the curve linked as `svg_name`.
pub fn render_markdown(summary: &Summary, svg_name: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## {}", summary.title);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{} pairs through the gateway ({}, similarity threshold {:.2}, guards: {}) in {:.1} s. A pair is \
         *served* when the lookup of `b` is answered from `a`'s entry: for a should-hit pair a saved call, for a \
         trap a wrong answer. Error rate: wrong answers over all pairs.",
        summary.overall.pairs + summary.overall.errors,
        summary
            .gateway_version
            .as_deref()
            .map_or_else(|| "Reprise".to_owned(), |v| format!("Reprise {v}")),
        summary.threshold,
        summary.guards.as_deref().unwrap_or("none"),
        summary.wall_s
    );
    let _ = writeln!(out);
    let v = summary.verify.as_ref();
    let (extra_head, extra_rule) = if v.is_some() {
        (" verified hits | judge calls/lookup |", "---:|---:|")
    } else {
        ("", "")
    };
    let _ = writeln!(
        out,
        "| category | pairs | should-hit served | traps served (wrong) | error rate | no candidate¹ | guarded² |{extra_head}"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|{extra_rule}");
    let row = |out: &mut String, name: &str, t: &Tally, verify: Option<[String; 2]>| {
        let extra = verify.map_or_else(String::new, |c| format!(" {} |", c.join(" | ")));
        let _ = writeln!(out, "| {name} | {} |{extra}", tally_cells(t).join(" | "));
    };
    row(
        &mut out,
        "**overall**",
        &summary.overall,
        v.map(|v| verify_cells(&v.overall)),
    );
    for g in &summary.categories {
        let cells = v.and_then(|v| verify_row(&v.categories, &g.name));
        row(&mut out, &g.name, &g.tally, cells);
    }
    for g in &summary.sources {
        let cells = v.and_then(|v| verify_row(&v.sources, &g.name));
        row(&mut out, &format!("file `{}`", g.name), &g.tally, cells);
    }
    if let Some(v) = v {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| verify stage | judge | verified hit TTFT | other hits TTFT | verdicts |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|");
        for [name, judge, verified, other, verdicts] in verify_latency_rows(v) {
            let name = if name == "overall" {
                "**overall**".to_owned()
            } else {
                name
            };
            let _ = writeln!(
                out,
                "| {name} | {judge} | {verified} | {other} | {verdicts} |"
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{VERIFY_NOTE}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "¹ Pairs whose lookup found no candidate at all: `a` and `b` differ before their final user message, \
         so they are in different cache partitions and are never compared (never served at any threshold)."
    );
    let _ = writeln!(
        out,
        "² Pairs whose candidate a guard refused (`x-reprise-nearest-guard`: the prompts differ in numbers or dates, \
         negation, format, task, direction, an antonym, a name or one slot of a shared frame), at any similarity: never served at any \
         threshold. For a trap, a wrong answer avoided; for a should-hit pair, a saving lost."
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Threshold sweep: each pair re-judged at another threshold from its recorded similarity (served iff \
         similarity ≥ threshold and no guard refused it; exact hits at any threshold). The gateway reports similarities to 4 decimals, \
         so at its own threshold the sweep can differ from its actual decisions above by a pair or two."
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| threshold | should-hit served | traps served (wrong) | error rate |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|");
    for p in &summary.sweep {
        let gateway = (p.threshold - summary.threshold).abs() < 1e-9;
        let t = if gateway {
            format!("**{:.2}** (gateway)", p.threshold)
        } else {
            format!("{:.2}", p.threshold)
        };
        let _ = writeln!(
            out,
            "| {t} | {} | {} | {} |",
            pct(p.hit_share),
            pct(p.trap_share),
            pct(p.error_rate)
        );
    }
    let _ = writeln!(out);
    for line in best_lines(summary) {
        let _ = writeln!(out, "- {line}");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "![threshold curve]({svg_name})");
    let mut warnings = String::new();
    write_warnings(&mut warnings, summary, "> ");
    if !warnings.is_empty() {
        let _ = writeln!(out);
        out.push_str(&warnings);
    }
    out
}

/// Writes `eval.md`, `threshold-curve.svg` and `results.jsonl` into `dir` (created if needed).
pub fn write_dir(dir: &Path, summary: &Summary, evaluation: &Evaluation) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let svg_name = "threshold-curve.svg";
    write("eval.md", &render_markdown(summary, svg_name))?;
    let scored: Vec<Scored> = evaluation
        .results
        .iter()
        .filter_map(PairResult::scored)
        .collect();
    write(
        svg_name,
        &super::chart::threshold_curve(&scored, summary.threshold, &summary.best, &summary.title)?,
    )?;
    let mut lines = String::new();
    for r in &evaluation.results {
        let line = serde_json::to_string(r).map_err(|e| e.to_string())?;
        lines.push_str(&line);
        lines.push('\n');
    }
    write("results.jsonl", &lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::GatewayInfo;

    fn result(category: &str, same: bool, outcome: &str, sim: Option<f64>) -> PairResult {
        PairResult {
            id: format!("{category}-{outcome}"),
            category: category.into(),
            source: "f.jsonl".into(),
            line: 1,
            same_answer: same,
            outcome: outcome.into(),
            served: matches!(outcome, "hit" | "semantic-hit"),
            similarity: sim,
            guard: None,
            skipped_lookups: 0,
            error: (outcome == "error").then(|| "HTTP 500: boom".to_owned()),
            verified: None,
            verify: None,
            verify_reason: None,
            judge_ms: None,
            ttft_ms: None,
        }
    }

    fn evaluation(results: Vec<PairResult>) -> Evaluation {
        Evaluation {
            url: "http://gw".into(),
            run_id: "r".into(),
            gateway: GatewayInfo {
                version: Some("0.1.0".into()),
                threshold: 0.9,
                guards: Some("numbers,negation".into()),
                model_dir: None,
                fallbacks: 0,
            },
            fallbacks_during_run: 0,
            results,
            wall_s: 1.0,
        }
    }

    /// Issue 24: at its default concurrency eval failed against a default gateway, whose skipped
    /// lookups looked like pairs with no candidate. They are counted apart now, not errors.
    #[test]
    fn skipped_lookups_are_counted_and_left_out_not_failed() {
        let mut retried = result("paraphrase", true, "semantic-hit", Some(0.93));
        retried.skipped_lookups = 2;
        let mut never = result("paraphrase", true, crate::eval::SKIPPED, None);
        never.skipped_lookups = 7;
        let eval = evaluation(vec![
            retried,
            never,
            result("paraphrase", true, "miss", Some(0.7)),
        ]);
        let s = summarize(&eval, "t");
        assert_eq!((s.overall.pairs, s.overall.errors), (2, 0));
        assert_eq!((s.skipped_lookups, s.skipped_pairs), (9, 1));
        assert_eq!(s.overall.hit_share(), Some(0.5));
        let line = "Skipped lookups (`x-reprise-semantic: skipped`, asked again): 9; pairs never matched and left out: 1.";
        assert!(render_text(&s).contains(line), "{}", render_text(&s));
        assert!(render_markdown(&s, "c.svg").contains(line));
    }

    #[test]
    fn summary_orders_weakest_first_and_counts_errors_apart() {
        let eval = evaluation(vec![
            result("paraphrase", true, "semantic-hit", Some(0.93)),
            result("paraphrase", true, "miss", Some(0.7)),
            result("near_repeat", true, "hit", Some(1.0)),
            result("negation", false, "semantic-hit", Some(0.95)),
            result("negation", false, "miss", Some(0.6)),
            result("number_date", false, "miss", Some(0.5)),
            result("number_date", false, "error", None),
        ]);
        let s = summarize(&eval, "t");
        assert_eq!(s.overall.pairs, 6);
        assert_eq!(s.overall.errors, 1);
        assert_eq!(s.overall.hit_share(), Some(2.0 / 3.0));
        assert_eq!(s.overall.trap_share(), Some(1.0 / 3.0));
        let names: Vec<&str> = s.categories.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(
            names,
            ["paraphrase", "near_repeat", "negation", "number_date"]
        );
        assert_eq!(s.failures.len(), 1);
        assert!(s.failures[0].contains("HTTP 500"));
        // One file: no per-file rows.
        assert!(s.sources.is_empty());
        // The sweep at the gateway's threshold matches the recorded decisions here.
        let at_gateway = s
            .sweep
            .iter()
            .find(|p| p.threshold == 0.9)
            .expect("report file");
        assert_eq!(at_gateway.hit_share, s.overall.hit_share());
        assert_eq!(at_gateway.trap_share, s.overall.trap_share());
        // ≤ 1% wrong: above the 0.95 trap only the exact hit is left among should-hits.
        let (budget, best) = s.best[0];
        assert_eq!(budget, 0.01);
        let best = best.expect("report file");
        assert_eq!(best.threshold, 1.0);
        assert_eq!(best.hit_share, 1.0 / 3.0);

        let text = render_text(&s);
        assert!(text.contains("66.7% (2/3)"), "{text}");
        assert!(text.contains("guards numbers,negation"), "{text}");
        assert!(text.contains("1 pairs could not be measured"), "{text}");
        let md = render_markdown(&s, "curve.svg");
        assert!(md.contains("| **overall** | 6 |"), "{md}");
        assert!(md.contains("![threshold curve](curve.svg)"));
        assert!(md.contains("**0.90** (gateway)"));
    }

    #[test]
    fn guarded_pairs_are_counted_and_served_at_no_threshold() {
        let mut guarded_trap = result("number_date", false, "miss", Some(0.97));
        guarded_trap.guard = Some("numbers".into());
        let eval = evaluation(vec![
            guarded_trap,
            result("paraphrase", true, "semantic-hit", Some(0.93)),
        ]);
        let s = summarize(&eval, "t");
        assert_eq!(s.overall.guarded, 1);
        // Without the guard, 0.97 would be served at every threshold up to 0.97.
        assert!(s.sweep.iter().all(|p| p.trap_share == Some(0.0)));
        let (_, best) = s.best[0];
        assert_eq!(best.expect("a threshold within budget").hit_share, 1.0);
        let md = render_markdown(&s, "c.svg");
        assert!(
            md.contains("| **overall** | 2 | 100.0% (1/1) | 0.0% (0/1) | 0.0% | 0 | 1 |"),
            "{md}"
        );
    }

    #[test]
    fn without_any_candidate_no_threshold_is_called_best() {
        let eval = evaluation(vec![
            result("context_swap", false, "miss", None),
            result("irrelevant_history", true, "miss", None),
        ]);
        let s = summarize(&eval, "t");
        assert!(s.best.iter().all(|(_, b)| b.is_none()));
        let text = render_text(&s);
        assert!(text.contains("no pair found a candidate"), "{text}");
        assert!(!text.contains("no threshold keeps"), "{text}");
    }

    /// A lookup of `b` as a gateway with `--verify judge` answers it.
    fn judged(
        category: &str,
        same: bool,
        outcome: &str,
        verdict: Option<&str>,
        verified: Option<&str>,
        judge_ms: Option<f64>,
        ttft_ms: f64,
    ) -> PairResult {
        PairResult {
            verify: verdict.map(str::to_owned),
            verified: verified.map(str::to_owned),
            judge_ms,
            ttft_ms: Some(ttft_ms),
            ..result(category, same, outcome, Some(0.86))
        }
    }

    #[test]
    fn verify_figures_count_judge_calls_and_time_verified_hits() {
        let eval = evaluation(vec![
            // Paraphrases: two judged and served, one judged different, one served by budget.
            judged(
                "paraphrase",
                true,
                "semantic-hit",
                Some("same"),
                Some("judge"),
                Some(100.0),
                104.0,
            ),
            judged(
                "paraphrase",
                true,
                "semantic-hit",
                Some("same"),
                Some("judge"),
                Some(200.0),
                205.0,
            ),
            judged(
                "paraphrase",
                true,
                "miss",
                Some("different"),
                None,
                Some(150.0),
                152.0,
            ),
            judged(
                "paraphrase",
                true,
                "semantic-hit",
                None,
                Some("budget"),
                None,
                3.0,
            ),
            // A trap the judge caught, one it let through, one never judged (below the floor).
            judged(
                "negation",
                false,
                "miss",
                Some("different"),
                None,
                Some(120.0),
                121.0,
            ),
            judged(
                "negation",
                false,
                "semantic-hit",
                Some("same"),
                Some("judge"),
                Some(90.0),
                93.0,
            ),
            judged("negation", false, "miss", None, None, None, 2.0),
            // An unjudged semantic hit (no verifier on this entry) and a failed pair.
            judged("near_repeat", true, "semantic-hit", None, None, None, 4.0),
            result("near_repeat", true, "error", None),
        ]);
        let s = summarize(&eval, "t");
        let v = s.verify.as_ref().expect("judge activity was seen");
        assert_eq!(v.overall.lookups, 8, "the failed pair is not a lookup");
        assert_eq!(v.overall.judge_calls, 5);
        assert_eq!(
            (v.overall.same, v.overall.different, v.overall.unsure),
            (3, 2, 0)
        );
        assert_eq!(
            (v.overall.verified_by_judge, v.overall.verified_by_budget),
            (3, 1)
        );
        assert_eq!(v.overall.calls_per_lookup(), Some(5.0 / 8.0));
        // Nearest rank: p50 of 90, 100, 120, 150, 200 is 120; p99 the largest.
        assert_eq!(
            (v.overall.judge.p50_ms, v.overall.judge.p99_ms),
            (Some(120.0), Some(200.0))
        );
        assert_eq!(v.overall.verified_hit_ttft.n, 3);
        assert_eq!(v.overall.verified_hit_ttft.p50_ms, Some(104.0));
        // The budget hit and the unjudged hit: served without a judge call.
        assert_eq!(v.overall.unverified_hit_ttft.n, 2);
        assert_eq!(v.overall.unverified_hit_ttft.p99_ms, Some(4.0));
        let paraphrase = &v
            .categories
            .iter()
            .find(|g| g.name == "paraphrase")
            .expect("row")
            .tally;
        assert_eq!((paraphrase.judge_calls, paraphrase.lookups), (3, 4));
        // Served shares stay what the gateway decided.
        assert_eq!(s.overall.traps_served, 1);

        let text = render_text(&s);
        assert!(text.contains("judge calls/lookup"), "{text}");
        assert!(text.contains("4 (1 budget)"), "{text}");
        assert!(text.contains("0.62 (5/8)"), "{text}");
        assert!(text.contains("120.0 / 200.0 (5)"), "{text}");
        assert!(text.contains("3 / 2 / 0"), "{text}");
        let md = render_markdown(&s, "c.svg");
        assert!(
            md.contains("| verified hits | judge calls/lookup |"),
            "{md}"
        );
        assert!(md.contains("| 0.75 (3/4) |"), "{md}");
        assert!(
            md.contains("| **overall** | 120.0 / 200.0 (5) | 104.0 / 205.0 (3) | 3.0 / 4.0 (2) | 3 / 2 / 0 |"),
            "{md}"
        );
        let json = serde_json::to_value(&s).expect("json");
        assert_eq!(json["verify"]["overall"]["judge_calls"], 5);
    }

    #[test]
    fn async_verdicts_are_counted_but_are_not_judge_calls() {
        let eval = evaluation(vec![
            judged("paraphrase", true, "miss", Some("queued"), None, None, 5.0),
            judged("paraphrase", true, "miss", Some("dropped"), None, None, 5.0),
        ]);
        let s = summarize(&eval, "t");
        let v = s.verify.expect("judge activity was seen");
        assert_eq!(
            (v.overall.queued, v.overall.dropped, v.overall.judge_calls),
            (1, 1, 0)
        );
        assert_eq!(v.overall.judge.n, 0);
    }

    #[test]
    fn without_judge_activity_the_report_is_unchanged() {
        let eval = evaluation(vec![
            judged("paraphrase", true, "semantic-hit", None, None, None, 4.0),
            result("negation", false, "miss", Some(0.6)),
        ]);
        let s = summarize(&eval, "t");
        assert!(s.verify.is_none());
        assert!(!render_text(&s).contains("judge"));
        let md = render_markdown(&s, "c.svg");
        assert!(!md.contains("verified hits"), "{md}");
        assert!(serde_json::to_value(&s)
            .expect("json")
            .get("verify")
            .is_none());
    }

    #[test]
    fn report_dir_holds_the_three_files() {
        let eval = evaluation(vec![
            result("paraphrase", true, "semantic-hit", Some(0.93)),
            result("negation", false, "miss", Some(0.6)),
        ]);
        let s = summarize(&eval, "t");
        let dir = tempfile::tempdir().expect("temp dir");
        write_dir(dir.path(), &s, &eval).expect("report file");
        let md = std::fs::read_to_string(dir.path().join("eval.md")).expect("report file");
        assert!(md.contains("threshold-curve.svg"));
        let svg =
            std::fs::read_to_string(dir.path().join("threshold-curve.svg")).expect("report file");
        assert!(svg.starts_with("<svg"), "{}", &svg[..50.min(svg.len())]);
        let lines = std::fs::read_to_string(dir.path().join("results.jsonl")).expect("report file");
        assert_eq!(lines.lines().count(), 2);
        let first: serde_json::Value =
            serde_json::from_str(lines.lines().next().expect("report file")).expect("report file");
        assert_eq!(first["similarity"], 0.93);
        assert_eq!(first["served"], true);
    }
}
