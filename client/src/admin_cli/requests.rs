//! `requests`: its arguments and the table of recent requests (outcome, status, timings).

use clap::Args;

use super::format::{fmt_opt_ms, fmt_since, push_table, table};
use super::GatewayArgs;
use crate::admin::{Completion, RequestsPage};

#[derive(Debug, Args)]
pub struct RequestsArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// How many (gateway default 100).
    #[arg(long)]
    pub limit: Option<u32>,
}

/// `requests`.
pub fn render_requests(page: &RequestsPage, now_ms: u64) -> String {
    let mut out = String::new();
    if page.data.is_empty() {
        out.push_str("no requests yet\n");
        return out;
    }
    let mut requests = table(
        &[
            "ID",
            "AGE",
            "ROUTE",
            "MODEL",
            "STATUS",
            "CACHE",
            "TTFT",
            "TOTAL",
            "SAVED",
            "TOKENS SAVED",
            "ENTRY",
        ],
        &[4, 6, 7, 8, 9],
    );
    for record in &page.data {
        let cache = match (record.similarity, record.nearest, &record.guard) {
            (Some(similarity), _, _) => format!("{} ({similarity:.3})", record.cache),
            (None, Some(nearest), Some(guard)) => {
                format!("{} (nearest {nearest:.3}, {guard} guard)", record.cache)
            }
            (None, Some(nearest), None) => format!("{} (nearest {nearest:.3})", record.cache),
            (None, None, _) => record.cache.to_string(),
        };
        let status = if record.completion.is(&Completion::Complete) {
            record.status.to_string()
        } else {
            let completion = record.completion.to_string();
            format!("{} {}", record.status, completion.replace('_', " "))
        };
        requests.add_row(vec![
            record.id.clone(),
            fmt_since(record.started_at_ms, now_ms),
            format!(
                "{} {}{}",
                record.method,
                record.route,
                if record.stream { " (stream)" } else { "" }
            ),
            record.model.clone().unwrap_or_else(|| "-".to_owned()),
            status,
            cache,
            fmt_opt_ms(record.phases.ttft_ms),
            fmt_opt_ms(Some(record.phases.total_ms)),
            fmt_opt_ms(record.ttft_saved_ms),
            record
                .saved
                .as_ref()
                .map_or_else(|| "-".to_owned(), fmt_saved),
            record.entry.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    push_table(&mut out, &requests);
    out
}

/// A hit's tokens saved, `input+output`, with their cost when priced and `(counted)` when the
/// upstream reported no usage.
fn fmt_saved(saved: &reprise_wire::TokensSaved) -> String {
    let mut text = format!("{}+{}", saved.input_tokens, saved.output_tokens);
    if let Some(usd) = saved.cost_usd {
        text.push_str(&format!(" ${usd:.4}"));
    }
    if saved.source == reprise_wire::TokenSource::Counted {
        text.push_str(" (counted)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_cli::tests::{fixture, NOW};

    #[test]
    fn requests_render_outcome_and_timings() {
        let page: RequestsPage = fixture(include_str!("../../tests/fixtures/requests.json"));
        let text = render_requests(&page, NOW);
        for expected in [
            "req_a1b2c3d4_2",
            "3m 15s ago",
            "POST chat.completions (stream)",
            "hit",
            "0.40 ms",
            "1.20 ms",
            "411 ms",
            "e_00000000002a",
            "502 upstream error",
            "miss (nearest 0.943, numbers guard)",
            "GET models",
            "15.5 ms",
            "812+164 $0.0037",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
