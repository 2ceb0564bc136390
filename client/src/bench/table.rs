//! The bench report as a plain-text table for the terminal ([`render`]), and the millisecond
//! format every bench rendering shares. Text only: the Markdown report and charts are `report.rs`
//! and `chart.rs`.

use super::timing::PhaseMeans;
use super::workload::Kind;
use super::{Percentiles, Report, TargetSummary};

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
