//! `shadow` and `feedback`: what semantic matching would have served, and operators' verdicts.
//! Their arguments and tables.

use clap::Args;

use super::format::{fmt_since, key_values, push_table, table};
use super::GatewayArgs;
use crate::admin::{truncate_chars, FeedbackPage, ShadowPage, VerdictRecord};

#[derive(Debug, Args)]
pub struct ShadowArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Only this namespace's decisions.
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only `hit`, `refuse` or `miss` decisions.
    #[arg(long)]
    pub would: Option<String>,
    /// How many, newest first (gateway default 50).
    #[arg(long)]
    pub limit: Option<u32>,
    /// The next_cursor of the previous page.
    #[arg(long)]
    pub cursor: Option<String>,
}

#[derive(Debug, Args)]
pub struct FeedbackArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// The judged response's x-reprise-request-id.
    #[arg(requires = "verdict")]
    pub request_id: Option<String>,
    /// `right` or `wrong`.
    #[arg(value_parser = ["right", "wrong"])]
    pub verdict: Option<String>,
    /// How many verdicts to list (gateway default 50).
    #[arg(long, conflicts_with = "request_id")]
    pub limit: Option<u32>,
}

/// `shadow`.
pub fn render_shadow(page: &ShadowPage, now_ms: u64) -> String {
    let mut out = String::new();
    if page.data.is_empty() {
        out.push_str("no shadow decisions (send requests with x-reprise-cache-mode: shadow)\n");
        return out;
    }
    let mut decisions = table(
        &[
            "REQUEST",
            "AGE",
            "WOULD",
            "SIMILARITY",
            "THRESHOLD",
            "REFUSED BY",
            "PROMPT",
            "CANDIDATE",
        ],
        &[3, 4],
    );
    for d in &page.data {
        let refused: Vec<&str> = d
            .guards
            .iter()
            .filter(|g| g.refuses)
            .map(|g| g.guard.as_str())
            .collect();
        // A guard that is off but would refuse is shown in parentheses: what turning it on changes.
        let refused: Vec<String> = refused
            .iter()
            .map(|name| {
                let on = d.guards.iter().any(|g| g.guard == *name && g.enabled);
                if on {
                    (*name).to_owned()
                } else {
                    format!("({name})")
                }
            })
            .collect();
        decisions.add_row(vec![
            d.request_id.clone(),
            fmt_since(d.at_ms, now_ms),
            d.would.clone(),
            format!("{:.4}", d.similarity),
            format!("{:.4}", d.threshold),
            if refused.is_empty() {
                "-".to_owned()
            } else {
                refused.join(",")
            },
            truncate_chars(&d.prompt, 40),
            format!("{} {}", d.entry, truncate_chars(&d.entry_prompt, 40)),
        ]);
    }
    push_table(&mut out, &decisions);
    if let Some(cursor) = &page.next_cursor {
        out.push_str(&format!("more: --cursor {cursor}\n"));
    }
    out
}

/// `feedback REQUEST_ID VERDICT`.
pub fn render_verdict(record: &VerdictRecord) -> String {
    let mut out = String::new();
    push_table(
        &mut out,
        &key_values(vec![
            ("request", record.request_id.clone()),
            ("verdict", record.verdict.clone()),
            ("met", record.met.clone()),
            ("entry", record.entry.clone()),
            (
                "similarity",
                record
                    .similarity
                    .map_or_else(|| "-".to_owned(), |s| format!("{s:.4}")),
            ),
            ("effect", record.effect.clone()),
        ]),
    );
    out
}

/// `feedback` (the list).
pub fn render_feedback(page: &FeedbackPage, now_ms: u64) -> String {
    let mut out = String::new();
    if page.data.is_empty() {
        out.push_str("no feedback yet\n");
        return out;
    }
    let mut verdicts = table(
        &[
            "REQUEST",
            "AGE",
            "VERDICT",
            "MET",
            "ENTRY",
            "SIMILARITY",
            "EFFECT",
            "PROMPT",
        ],
        &[5],
    );
    for r in &page.data {
        verdicts.add_row(vec![
            r.request_id.clone(),
            fmt_since(r.at_ms, now_ms),
            r.verdict.clone(),
            r.met.clone(),
            r.entry.clone(),
            r.similarity
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.4}")),
            r.effect.clone(),
            truncate_chars(&r.prompt, 40),
        ]);
    }
    push_table(&mut out, &verdicts);
    out
}
