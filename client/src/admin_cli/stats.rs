//! `stats` and `metrics`: their arguments and the stats tables (counts, rates, TTFT saved, errors,
//! guard refusals, latency by outcome). `metrics` prints the Prometheus text as it comes.

use clap::Args;

use super::format::{fmt_age, fmt_bytes, fmt_ms, fmt_pct, key_values, push_table, table};
use super::GatewayArgs;
use crate::admin::{Savings, SavingsRow, Stats, Summary};

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

#[derive(Debug, Args)]
pub struct MetricsArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

/// Outcomes in the order an operator reads them: the cheap ones first.
const OUTCOMES: [&str; 4] = ["hit", "semantic-hit", "coalesced", "miss"];

pub(super) fn outcome_label(outcome: &str) -> String {
    outcome.replace('-', " ")
}

/// Dollars with four decimals; `-` for a group whose hits were all of unpriced models.
fn fmt_usd(row: &SavingsRow) -> String {
    if row.hits > 0 && row.unpriced == row.hits {
        "-".to_owned()
    } else {
        format!("${:.4}", row.cost_usd)
    }
}

/// The summary lines of what hits saved: tokens, money, the judge's cost and the price table.
fn push_savings(summary: &mut Vec<(&'static str, String)>, savings: &Savings) {
    let t = &savings.total;
    let mut tokens = format!(
        "{} input + {} output over {} hits",
        t.input_tokens, t.output_tokens, t.hits
    );
    if t.counted > 0 {
        tokens.push_str(&format!(" ({} counted with a tokenizer)", t.counted));
    }
    summary.push(("Tokens saved", tokens));
    let mut money = format!("{} at list prices", fmt_usd(t));
    if t.unpriced > 0 {
        money.push_str(&format!(" ({} hits of unpriced models)", t.unpriced));
    }
    if savings.judge.calls > 0 {
        money.push_str(&format!(
            "; judge calls ${:.4}; net ${:.4}",
            savings.judge.cost_usd, savings.net_cost_usd
        ));
    }
    summary.push(("Money saved", money));
    if savings.shadow.hits > 0 {
        summary.push((
            "Shadow would save",
            format!(
                "{} input + {} output tokens, {} over {} would-be hits",
                savings.shadow.input_tokens,
                savings.shadow.output_tokens,
                fmt_usd(&savings.shadow),
                savings.shadow.hits
            ),
        ));
    }
    summary.push(("Prices", format!("of {}", savings.prices.date)));
}

/// `reprise-client stats`.
pub fn render_stats(stats: &Stats) -> String {
    let mut out = String::new();
    let mut summary = vec![
        (
            "Gateway",
            format!(
                "Reprise {}, {} mode, up {}",
                stats.version,
                stats.mode,
                fmt_age(stats.uptime_s)
            ),
        ),
        (
            "Store",
            format!(
                "{} entries, {}",
                stats.store.entries,
                fmt_bytes(stats.store.bytes)
            ),
        ),
    ];
    if let Some(index) = &stats.index {
        summary.push((
            "Index",
            format!(
                "{} vectors, {} tombstones{}{}",
                index.vectors,
                index.tombstones,
                if index.rebuilding { ", rebuilding" } else { "" },
                match index.graphs_pending {
                    0 => String::new(),
                    n => format!(", {n} graph(s) building (exact scans meanwhile)"),
                }
            ),
        ));
    }
    let rates = &stats.rates;
    summary.push((
        "Hit rate",
        format!(
            "{} (exact {}, semantic {}, coalesced {}); miss {}, bypass {}",
            fmt_pct(rates.hit),
            fmt_pct(rates.exact_hit),
            fmt_pct(rates.semantic_hit),
            fmt_pct(rates.coalesced),
            fmt_pct(rates.miss),
            fmt_pct(rates.bypass)
        ),
    ));
    let saved = &stats.ttft_saved_ms;
    summary.push((
        "TTFT saved",
        match saved.per_hit {
            Some(per_hit) => format!(
                "{} over {} hits ({} per hit)",
                fmt_ms(saved.total),
                saved.hits,
                fmt_ms(per_hit)
            ),
            None => format!("{} over {} hits", fmt_ms(saved.total), saved.hits),
        },
    ));
    if let Some(savings) = &stats.savings {
        push_savings(&mut summary, savings);
    }
    if let Some(embedding) = &stats.embedding {
        let mut text = format!("{} texts in {} batches", embedding.texts, embedding.batches);
        if let Some(mean) = embedding.mean_batch_size {
            text.push_str(&format!(" (mean {mean:.2})"));
        }
        if let (Some(p50), Some(p99)) = (embedding.p50_ms, embedding.p99_ms) {
            text.push_str(&format!(", p50 {}, p99 {}", fmt_ms(p50), fmt_ms(p99)));
        }
        text.push_str(&format!(", {} fallbacks", embedding.fallbacks));
        summary.push(("Embedding", text));
    }
    if stats.embedding.is_some() {
        let refused = &stats.guard_refusals;
        summary.push((
            "Guard refusals",
            format!(
                "numbers {}, negation {}, format {}, task {}, direction {}, antonym {}, entity {}, \
                 template {} (semantic matches not served)",
                refused.numbers,
                refused.negation,
                refused.format,
                refused.task,
                refused.direction,
                refused.antonym,
                refused.entity,
                refused.template
            ),
        ));
    }
    if let Some(fb) = &stats.feedback {
        summary.push((
            "Feedback",
            format!(
                "right {}, wrong {} ({} pairs vetoed, {} prompts approved)",
                fb.right, fb.wrong, fb.vetoes, fb.approvals
            ),
        ));
    }
    if let Some(j) = stats
        .judge
        .as_ref()
        .filter(|j| j.calls + j.over_budget + j.queued > 0)
    {
        let latency = match (j.p50_ms, j.p99_ms) {
            (Some(p50), Some(p99)) => format!(", p50 {p50:.0} ms, p99 {p99:.0} ms"),
            _ => String::new(),
        };
        summary.push((
            "Judge",
            format!(
                "{} calls: same {}, different {}, unsure {}; {} over budget, {} dropped{latency}; {} + {} tokens",
                j.calls, j.same, j.different, j.unsure, j.over_budget, j.dropped, j.prompt_tokens, j.completion_tokens
            ),
        ));
    }
    let errors = &stats.upstream_errors;
    summary.push((
        "Upstream errors",
        format!(
            "connect {}, timeout {}, protocol {}, status {}, stream {}",
            errors.connect, errors.timeout, errors.protocol, errors.status, errors.stream
        ),
    ));
    push_table(&mut out, &key_values(summary));

    out.push_str("\nRequests\n");
    let counts = &stats.requests;
    let mut requests = table(&["OUTCOME", "COUNT", "SHARE"], &[1, 2]);
    for (label, count, share) in [
        ("hit", counts.hit, Some(rates.exact_hit)),
        (
            "semantic hit",
            counts.semantic_hit,
            Some(rates.semantic_hit),
        ),
        ("coalesced", counts.coalesced, Some(rates.coalesced)),
        ("miss", counts.miss, Some(rates.miss)),
        ("bypass", counts.bypass, Some(rates.bypass)),
        ("refresh", counts.refresh, None),
        ("pass", counts.pass, None),
        ("errors", counts.errors, None),
        ("total", counts.total, None),
    ] {
        requests.add_row(vec![
            label.to_owned(),
            count.to_string(),
            share.map(fmt_pct).unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    push_table(&mut out, &requests);

    if let Some(savings) = stats.savings.as_ref().filter(|s| !s.by_model.is_empty()) {
        out.push_str("\nSaved by model\n");
        let mut by_model = table(
            &["MODEL", "HITS", "INPUT TOKENS", "OUTPUT TOKENS", "USD"],
            &[1, 2, 3, 4],
        );
        for (model, row) in &savings.by_model {
            by_model.add_row(vec![
                model.clone(),
                row.hits.to_string(),
                row.input_tokens.to_string(),
                row.output_tokens.to_string(),
                fmt_usd(row),
            ]);
        }
        push_table(&mut out, &by_model);
    }

    out.push_str(&format!(
        "\nLatency (last {} requests)\n",
        stats.latency.window
    ));
    if stats.latency.by_outcome.is_empty() {
        out.push_str("no requests in the window\n");
        return out;
    }
    let mut latency = table(
        &[
            "OUTCOME",
            "COUNT",
            "TTFT P50",
            "TTFT P90",
            "TTFT P99",
            "TOTAL P50",
            "TOTAL P90",
            "TOTAL P99",
        ],
        &[1, 2, 3, 4, 5, 6, 7],
    );
    let known = OUTCOMES.iter().map(|o| o.to_string());
    let others = stats
        .latency
        .by_outcome
        .keys()
        .filter(|k| !OUTCOMES.contains(&k.as_str()))
        .cloned();
    for outcome in known.chain(others) {
        let Some(entry) = stats.latency.by_outcome.get(&outcome) else {
            continue;
        };
        let pick = |p: Option<Summary>, f: fn(&Summary) -> f64| {
            p.as_ref()
                .map(f)
                .map(fmt_ms)
                .unwrap_or_else(|| "-".to_owned())
        };
        let phase = |name: &str| entry.phases.get(name).copied().flatten();
        let (ttft, total) = (phase("ttft_ms"), phase("total_ms"));
        latency.add_row(vec![
            outcome_label(&outcome),
            entry.count.to_string(),
            pick(ttft, |p| p.p50),
            pick(ttft, |p| p.p90),
            pick(ttft, |p| p.p99),
            pick(total, |p| p.p50),
            pick(total, |p| p.p90),
            pick(total, |p| p.p99),
        ]);
    }
    push_table(&mut out, &latency);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_cli::tests::fixture;

    #[test]
    fn stats_render_counts_rates_savings_and_latency() {
        let stats: Stats = fixture(include_str!("../../tests/fixtures/stats.json"));
        let text = render_stats(&stats);
        for expected in [
            "Reprise 0.1.0, semantic mode, up 2m 3s",
            "12 entries, 33.8 KiB",
            "12 vectors, 0 tombstones",
            "61.0% (exact 44.0%, semantic 11.0%, coalesced 6.0%); miss 33.0%, bypass 6.0%",
            "12.3 s over 30 hits (411 ms per hit)",
            "25 texts in 17 batches (mean 1.47), p50 5.10 ms, p99 12.0 ms, 2 fallbacks",
            "connect 0, timeout 0, protocol 0, status 1, stream 0",
            "numbers 3, negation 1, format 0, task 0, direction 0, antonym 0, entity 0, template 0 (semantic matches not served)",
            "Latency (last 1000 requests)",
            "41 calls: same 30, different 9, unsure 2; 3 over budget, 0 dropped, p50 182 ms, p99 611 ms; 5120 + 164 tokens",
            "Tokens saved",
            "24000 input + 6200 output over 30 hits (4 counted with a tokenizer)",
            "$0.1180 at list prices (2 hits of unpriced models); judge calls $0.0021; net $0.1159",
            "1200 input + 300 output tokens, $0.0060 over 3 would-be hits",
            "of 2025-11-24",
            "Saved by model",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
        // A row with its alignment padding collapsed, found by how it starts.
        let line = |prefix: &str| {
            text.lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"))
        };
        assert_eq!(line("semantic hit 10"), "semantic hit 10 11.0%");
        assert_eq!(line("total"), "total 100 -");
        assert_eq!(line("gpt-4o-mini 28"), "gpt-4o-mini 28 22000 5600 $0.1180");
        assert_eq!(line("sim-model 2"), "sim-model 2 2000 600 -");
        // Latency rows: count, then ttft p50/p90/p99, then total p50/p90/p99.
        assert_eq!(
            line("hit 40 0.42"),
            "hit 40 0.42 ms 0.61 ms 1.87 ms 1.25 ms 2.50 ms 4.75 ms"
        );
        assert_eq!(
            line("miss 30 412"),
            "miss 30 412 ms 640 ms 1210 ms 1320 ms 2050 ms 3330 ms"
        );
        assert!(line("semantic hit 10 5.60").starts_with("semantic hit 10 5.60 ms 8.20 ms 12.4 ms"));
        // The cheap outcomes come first.
        let rows: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let position = |prefix: &str| rows.iter().position(|l| l.starts_with(prefix));
        assert!(position("hit 40 0.42") < position("miss 30 412"));
        assert!(text.lines().all(|l| l == l.trim_end()), "trailing spaces");
    }

    #[test]
    fn stats_render_exact_only_without_traffic() {
        let stats: Stats = fixture(include_str!("../../tests/fixtures/stats_exact_only.json"));
        assert!(stats.index.is_none());
        let text = render_stats(&stats);
        assert!(text.contains("exact-only mode"), "{text}");
        assert!(!text.contains("Index"), "{text}");
        assert!(text.contains("0.00 ms over 0 hits\n"), "{text}");
        assert!(text.contains("no requests in the window"), "{text}");
    }
}
