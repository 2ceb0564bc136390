//! `--report DIR`: the run as a Markdown report (`report.md`) with its SVG charts beside it, and the
//! same figures as JSON (`report.json`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{chart, fmt_ms, Percentiles, Report, TargetSummary};

/// Writes the report into `dir` (created if needed); returns the files written.
pub fn write(dir: &Path, report: &Report) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    let mut save = |name: &str, text: &str| -> Result<(), String> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
        Ok(())
    };
    let mut charts: BTreeMap<usize, Vec<(String, String)>> = BTreeMap::new();
    for (i, target) in report.targets.iter().enumerate() {
        let series = chart::cdf_series(&report.samples, i, 400);
        let title = format!("[{}] TTFT by cache outcome", i + 1);
        if let Some(svg) = chart::ttft_cdf(&title, &series)? {
            let name = format!("ttft-{}.svg", i + 1);
            save(&name, &svg)?;
            charts
                .entry(i)
                .or_default()
                .push((name, "TTFT distribution by outcome".into()));
        }
        let phases: BTreeMap<String, _> = target
            .by_outcome
            .iter()
            .filter_map(|(o, s)| s.phases.clone().map(|p| (o.clone(), p)))
            .collect();
        let title = format!("[{}] gateway phases by outcome (means)", i + 1);
        if let Some(svg) = chart::phase_stack(&title, &chart::phase_bars(&phases))? {
            let name = format!("phases-{}.svg", i + 1);
            save(&name, &svg)?;
            charts
                .entry(i)
                .or_default()
                .push((name, "Per-phase stacked bar, miss vs hit".into()));
        }
    }
    let json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    save("report.json", &json)?;
    save("report.md", &markdown(report, &charts))?;
    Ok(written)
}

fn triple(p: &Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{} | {} | {}", fmt_ms(p.p50), fmt_ms(p.p90), fmt_ms(p.p99)),
        None => "- | - | -".into(),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// The Markdown text; `charts` names each target's SVG files (relative to the report).
pub fn markdown(report: &Report, charts: &BTreeMap<usize, Vec<(String, String)>>) -> String {
    let mut md = String::new();
    let run = &report.run;
    let _ = writeln!(md, "# reprise-client bench report\n");
    let _ = writeln!(
        md,
        "Started {}. {}, {}. Workload: {}.{} Wall time {:.2} s. Times are client-side milliseconds \
         unless marked; percentiles are nearest-rank.\n",
        run.started,
        run.mode,
        if run.stream { "streaming" } else { "non-streaming" },
        run.workload,
        run.namespace
            .as_ref()
            .map(|n| format!(" Namespace `{n}`."))
            .unwrap_or_default(),
        report.wall_s
    );
    if !run.constructed.is_empty() {
        let parts: Vec<String> = run
            .constructed
            .iter()
            .map(|(k, c)| format!("{c} {k}"))
            .collect();
        let _ = writeln!(
            md,
            "Requests drawn by construction (what the workload asked for, before any cache \
             answered; each is sent to every target{}): {}.\n",
            if report.open_loop.as_ref().is_some_and(|o| o.dropped > 0) {
                " unless dropped"
            } else {
                ""
            },
            parts.join(", ")
        );
    }
    if let Some(o) = &report.open_loop {
        let _ = writeln!(md, "{}.\n", capitalize(&o.describe()));
    }
    for (i, t) in report.targets.iter().enumerate() {
        target_section(
            &mut md,
            i,
            t,
            charts.get(&i).map(Vec::as_slice).unwrap_or(&[]),
        );
    }
    if let Some(c) = &report.comparison {
        let (a, b) = (&report.targets[0], &report.targets[1]);
        let _ = writeln!(md, "## Comparison: [2] against [1]\n");
        let _ = writeln!(md, "| | [1] | [2] | [2] / [1] |\n|---|---|---|---|");
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), fmt_ms);
        let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |r| format!("{r:.3}"));
        let p = |t: &TargetSummary, f: fn(&Percentiles) -> f64| t.ttft_ms.as_ref().map(f);
        let rows = [
            (
                "TTFT p50, ms",
                p(a, |x| x.p50),
                p(b, |x| x.p50),
                c.ttft_p50_ratio,
            ),
            (
                "TTFT p99, ms",
                p(a, |x| x.p99),
                p(b, |x| x.p99),
                c.ttft_p99_ratio,
            ),
            (
                "total p50, ms",
                a.total_ms.as_ref().map(|x| x.p50),
                b.total_ms.as_ref().map(|x| x.p50),
                c.total_p50_ratio,
            ),
            (
                "throughput, requests/s",
                a.service_rate_per_s.or(Some(a.requests_per_s)),
                b.service_rate_per_s.or(Some(b.requests_per_s)),
                c.throughput_ratio,
            ),
        ];
        for (name, x, y, r) in rows {
            let _ = writeln!(md, "| {name} | {} | {} | {} |", cell(x), cell(y), ratio(r));
        }
        if let Some(d) = &c.paired_ttft_diff_ms {
            let _ = writeln!(
                md,
                "\nPaired TTFT difference ([1] minus [2] for the same request), ms: p50 {}, p90 {}, p99 {}, mean {}.",
                fmt_ms(d.p50),
                fmt_ms(d.p90),
                fmt_ms(d.p99),
                fmt_ms(d.mean)
            );
        }
        let _ = writeln!(
            md,
            "\nThroughput in closed loop is concurrency / mean total time per target (the targets \
             share the run's wall time); in open loop, completed requests per second.\n"
        );
    }
    md
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

fn target_section(md: &mut String, i: usize, t: &TargetSummary, charts: &[(String, String)]) {
    let _ = writeln!(md, "## [{}] {}\n", i + 1, t.url);
    let ok: usize = t.outcomes.values().sum();
    let _ = writeln!(
        md,
        "{} requests, {} errors, {:.1} requests/s over the wall time{}.",
        t.requests,
        t.errors,
        t.requests_per_s,
        t.service_rate_per_s
            .map(|r| format!(" ({r:.1}/s by service time)"))
            .unwrap_or_default()
    );
    if let Some(h) = &t.hit_rate {
        let _ = writeln!(
            md,
            "Hit rate: exact {}, semantic {}, coalesced {}; served from the cache {}. TTFT saved \
             (sum of `x-reprise-ttft-saved-ms`): {:.2} s.",
            pct(h.exact),
            pct(h.semantic),
            pct(h.coalesced),
            pct(h.served),
            t.ttft_saved_s
        );
    }
    if t.hit_rate.is_some() {
        let _ = writeln!(md, "{}.", capitalize(&super::skipped_line(t)));
    }
    if let Some(x) = t.hit_speedup_p50 {
        let _ = writeln!(md, "Hit TTFT speed-up (miss p50 / hit p50): {x:.0}x.");
    }
    if let Some(s) = &t.similarity {
        let _ = writeln!(
            md,
            "Similarity of the semantic hits: p50 {:.3}, mean {:.3}.",
            s.p50, s.mean
        );
    }
    let _ = writeln!(
        md,
        "\n| outcome | requests | share | TTFT p50 | p90 | p99 | total p50 | p90 | p99 | gap p50 | p90 | p99 |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (o, s) in &t.by_outcome {
        let _ = writeln!(
            md,
            "| {o} | {} | {} | {} | {} | {} |",
            s.count,
            pct(s.count as f64 / ok.max(1) as f64),
            triple(&s.ttft_ms),
            triple(&s.total_ms),
            triple(&s.itl_ms)
        );
    }
    if t.by_outcome.len() > 1 {
        let _ = writeln!(
            md,
            "| **all** | {ok} | 100% | {} | {} | {} |",
            triple(&t.ttft_ms),
            triple(&t.total_ms),
            triple(&t.itl_ms)
        );
    }
    let _ = writeln!(
        md,
        "\nGaps are the times between successive content chunks as the client received them.\n"
    );
    let outcomes: BTreeSet<&String> = t.by_construction.values().flat_map(|m| m.keys()).collect();
    if !t.by_construction.is_empty() {
        let _ = writeln!(md, "Outcome by construction:\n");
        let head: Vec<&str> = outcomes.iter().map(|o| o.as_str()).collect();
        let _ = writeln!(md, "| constructed as | {} |", head.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(head.len()));
        for (kind, counts) in &t.by_construction {
            let cells: Vec<String> = outcomes
                .iter()
                .map(|o| counts.get(*o).copied().unwrap_or(0).to_string())
                .collect();
            let _ = writeln!(md, "| {kind} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    let timed: Vec<_> = t
        .by_outcome
        .iter()
        .filter_map(|(o, s)| s.phases.as_ref().map(|p| (o, p)))
        .collect();
    if !timed.is_empty() {
        let _ = writeln!(
            md,
            "Gateway phases, mean ms (from the stream's timing comment or `Server-Timing`; a phase \
             a request did not have counts as 0):\n"
        );
        let _ = writeln!(
            md,
            "| outcome | timed | ingress | lookup | embed | search | upstream send | ttft | decode | downstream | total |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
        for (o, p) in timed {
            let _ = writeln!(md, "| {o} | {} | {} |", p.timed, p.mean_cells().join(" | "));
        }
        md.push('\n');
    }
    for (file, alt) in charts {
        let _ = writeln!(md, "![{alt}]({file})\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::tests::{sample, test_config};
    use crate::bench::timing::Phases;
    use crate::bench::{summarize, workload::Kind};
    use std::time::Duration;

    #[test]
    fn writes_markdown_json_and_charts() {
        let config = test_config(&["http://gw/v1", "http://sim/v1"]);
        let mut samples = Vec::new();
        for i in 0..6 {
            let mut s = sample(
                0,
                i,
                if i < 3 { 400.0 } else { 0.5 },
                if i < 3 { "miss" } else { "hit" },
            );
            s.kind = if i < 3 { Kind::New } else { Kind::Repeat };
            s.phases = Some(Phases {
                ingress_ms: Some(0.1),
                ttft_ms: s.ttft_ms,
                ..Phases::default()
            });
            samples.push(s);
            samples.push(sample(1, i, 400.0, "none"));
        }
        let mut report = summarize(&config, &samples, Duration::from_secs(1));
        report.samples = samples;
        let dir = std::env::temp_dir().join(format!("reprise-bench-report-{}", std::process::id()));
        let written = write(&dir, &report).expect("written");
        let names: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        for name in [
            "ttft-1.svg",
            "phases-1.svg",
            "ttft-2.svg",
            "report.json",
            "report.md",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        // The direct upstream sends no timing: no phase chart for it.
        assert!(!names.iter().any(|n| n == "phases-2.svg"));
        let md = std::fs::read_to_string(dir.join("report.md")).expect("md");
        assert!(
            md.contains("![TTFT distribution by outcome](ttft-1.svg)"),
            "{md}"
        );
        assert!(md.contains("| repeat | 3 | 0 |"), "{md}");
        assert!(md.contains("## Comparison: [2] against [1]"), "{md}");
        assert!(md.contains("| hit | 3 | 50.0% | 0.500 |"), "{md}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).expect("json"))
                .expect("valid JSON");
        assert_eq!(json["targets"][0]["outcomes"]["hit"], 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
