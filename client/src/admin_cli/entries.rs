//! `entries` (ls, search, show, rm), `invalidate`, `flush` and `warm`: the cache's contents. Their
//! arguments, the calls `entries` makes, and the tables of entries, one entry and what was removed
//! or warmed.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::Table;
use serde_json::value::RawValue;

use super::format::{
    fmt_age, fmt_bytes, fmt_ms, fmt_opt_ms, fmt_since, fmt_timestamp, key_values, one_line,
    push_table, table,
};
use super::stats::outcome_label;
use super::{emit, parse_seconds, pretty_array, show, CliError, GatewayArgs};
use crate::admin::{
    decode, AdminCall, EntryDeleted, EntryDetail, EntryPage, EntrySummary, Flush, Invalidation,
    ListQuery, Phases, WarmFormat, WarmResult,
};

#[derive(Debug, Args)]
pub struct EntriesArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(subcommand)]
    pub command: EntriesCommand,
}

#[derive(Debug, Subcommand)]
pub enum EntriesCommand {
    /// List entries, newest first.
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Everything about one entry: prompt, answer, timings, hit history.
    Show {
        /// The entry's id (`e_…`, as `entries ls` and `x-reprise-entry` show it).
        id: String,
    },
    /// Delete entries by id.
    #[command(visible_alias = "delete")]
    Rm {
        /// One or more entry ids (`e_…`); each is deleted on its own, and those that fail are listed.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Semantic search over cached prompts, most similar first.
    Search(SearchArgs),
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only this namespace (exact).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only this model (exact).
    #[arg(long)]
    pub model: Option<String>,
    /// Entries per page, 1..=200 (gateway default 20).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Start after this cursor (the next_cursor of the previous page).
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow cursors to the last page.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct SearchArgs {
    /// The text whose nearest cached prompts are listed (embedded by the gateway).
    pub query: String,
    /// Most results, 1..=200 (gateway default 20).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Only this namespace (exact).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only this model (exact).
    #[arg(long)]
    pub model: Option<String>,
}

#[derive(Debug, Args)]
pub struct InvalidateArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Only entries of this namespace (exact, as `x-reprise-namespace` set it).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only entries of this model (exact, as the request named it).
    #[arg(long)]
    pub model: Option<String>,
    /// Tenant hash prefix (as `entries ls` shows it) or `shared`.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only entries older than this: 1h, 30m, 3600s, 2d or plain seconds.
    #[arg(long, value_parser = parse_seconds)]
    pub older_than: Option<u64>,
    /// Only entries whose prompt is similar to this text.
    #[arg(long)]
    pub similar_to: Option<String>,
    /// Similarity floor for --similar-to (default: the gateway's threshold).
    #[arg(long)]
    pub min_similarity: Option<f32>,
    /// Count the matches without deleting them.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct FlushArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Confirm that every entry should be deleted.
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct WarmArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Items to warm: FILE.jsonl / FILE.ndjson / FILE.json, or - for stdin.
    pub file: String,
    /// Body format when the file name does not say (default: guessed from the content).
    #[arg(long, value_enum)]
    pub format: Option<WarmFileFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WarmFileFormat {
    Json,
    Jsonl,
}

pub(super) async fn run_entries(
    args: EntriesArgs,
    out: &mut dyn Write,
    now: u64,
) -> Result<(), CliError> {
    let gateway = &args.gateway;
    let render = |page: EntryPage| render_entries(&page, now);
    match args.command {
        EntriesCommand::Ls(ls) => {
            let query = ListQuery {
                namespace: ls.namespace,
                model: ls.model,
                q: None,
                limit: ls.limit,
                cursor: ls.cursor,
            };
            if !ls.all {
                return show(out, gateway, AdminCall::Entries(query), render).await;
            }
            let items = gateway.client()?.entries_all_raw(&query).await?;
            // The pages merged into one list, shaped like a single last page.
            #[derive(serde::Serialize)]
            struct Merged<'a> {
                object: &'a str,
                data: &'a [Box<RawValue>],
                has_more: bool,
                next_cursor: Option<String>,
            }
            let merged = serde_json::to_vec(&Merged {
                object: "list",
                data: &items,
                has_more: false,
                next_cursor: None,
            })
            .map_err(std::io::Error::other)?;
            emit(out, gateway, "GET /admin/entries", &merged, render)
        }
        EntriesCommand::Search(search) => {
            let query = ListQuery {
                namespace: search.namespace,
                model: search.model,
                q: Some(search.query),
                limit: search.limit,
                cursor: None,
            };
            show(out, gateway, AdminCall::Entries(query), render).await
        }
        EntriesCommand::Show { id } => {
            show(out, gateway, AdminCall::Entry(id), |entry: EntryDetail| {
                render_entry(&entry, now)
            })
            .await
        }
        EntriesCommand::Rm { ids } => {
            let client = gateway.client()?;
            let total = ids.len();
            let mut responses = Vec::new();
            let mut failures = Vec::new();
            // Keep going after a failure: the other ids are independent, and the error lists
            // exactly which ones are left.
            for id in ids {
                let call = AdminCall::DeleteEntry(id.clone());
                match client.call_raw(&call).await {
                    Ok(body) => responses.push((call.describe(), body)),
                    Err(err) => failures.push((id, err)),
                }
            }
            if gateway.json {
                let mut raw = Vec::new();
                for (call, body) in &responses {
                    raw.push(decode::<Box<RawValue>>(body, call)?);
                }
                writeln!(
                    out,
                    "{}",
                    pretty_array(&raw).map_err(std::io::Error::other)?
                )?;
            } else {
                for (call, body) in &responses {
                    let deleted: EntryDeleted = decode(body, call)?;
                    writeln!(out, "{}", render_deleted(&deleted))?;
                }
            }
            if failures.is_empty() {
                Ok(())
            } else {
                Err(CliError::Deletions { total, failures })
            }
        }
    }
}

/// The warm body's format: `--format`, else the file extension, else the content (a body that is
/// one JSON document is JSON; anything else, e.g. several objects on separate lines, is JSON Lines).
pub fn warm_format(path: &str, explicit: Option<WarmFileFormat>, body: &[u8]) -> WarmFormat {
    if let Some(format) = explicit {
        return match format {
            WarmFileFormat::Json => WarmFormat::Json,
            WarmFileFormat::Jsonl => WarmFormat::JsonLines,
        };
    }
    let extension = std::path::Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("jsonl" | "ndjson") => WarmFormat::JsonLines,
        Some("json") => WarmFormat::Json,
        _ if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() => WarmFormat::Json,
        _ => WarmFormat::JsonLines,
    }
}

/// `entries ls` and `entries search`.
pub fn render_entries(page: &EntryPage, now_ms: u64) -> String {
    let mut out = String::new();
    if page.data.is_empty() {
        out.push_str("no entries\n");
        return out;
    }
    let searched = page.data.iter().any(|e| e.similarity.is_some());
    let mut header = vec!["ID"];
    if searched {
        header.push("SIMILARITY");
    }
    header.extend([
        "AGE",
        "MODEL",
        "NAMESPACE",
        "HITS",
        "LAST HIT",
        "TTFT COST",
        "PROMPT",
    ]);
    let numeric: Vec<usize> = if searched { vec![1, 5, 7] } else { vec![4, 6] };
    let mut entries = table(&header, &numeric);
    for entry in &page.data {
        entries.add_row(entry_row(entry, searched, now_ms));
    }
    push_table(&mut out, &entries);
    let count = page.data.len();
    let noun = if count == 1 { "entry" } else { "entries" };
    match (&page.next_cursor, page.has_more) {
        (Some(cursor), true) => out.push_str(&format!(
            "{count} {noun}; more with --cursor {cursor} (or --all)\n"
        )),
        _ => out.push_str(&format!("{count} {noun}\n")),
    }
    out
}

fn entry_row(entry: &EntrySummary, searched: bool, now_ms: u64) -> Vec<String> {
    let mut row = vec![entry.id.clone()];
    if searched {
        row.push(
            entry
                .similarity
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".to_owned()),
        );
    }
    row.extend([
        fmt_age(entry.age_s),
        entry.model.clone(),
        entry.namespace.clone().unwrap_or_else(|| "-".to_owned()),
        entry.hit_count.to_string(),
        entry
            .last_hit_ms
            .map(|ms| fmt_since(ms, now_ms))
            .unwrap_or_else(|| "never".to_owned()),
        if entry.warmed && entry.ttft_cost_ms.is_none() {
            "warmed".to_owned()
        } else {
            fmt_opt_ms(entry.ttft_cost_ms)
        },
        one_line(&entry.prompt, 48),
    ]);
    row
}

/// `entries show ID`.
pub fn render_entry(entry: &EntryDetail, now_ms: u64) -> String {
    let summary = &entry.summary;
    let mut out = String::new();
    let mut rows = vec![
        ("id", summary.id.clone()),
        ("route", summary.route.clone()),
        ("model", summary.model.clone()),
        (
            "namespace",
            summary.namespace.clone().unwrap_or_else(|| "-".to_owned()),
        ),
        ("tenant", summary.tenant.clone()),
        ("stream", summary.stream.to_string()),
        ("warmed", summary.warmed.to_string()),
        (
            "created",
            format!(
                "{} ago ({})",
                fmt_age(summary.age_s),
                fmt_timestamp(summary.created_at_ms)
            ),
        ),
        (
            "expires",
            match summary.expires_at_ms {
                Some(at) if at >= now_ms => format!(
                    "in {} ({})",
                    fmt_age((at - now_ms) as f64 / 1000.0),
                    fmt_timestamp(at)
                ),
                Some(at) => format!("expired ({})", fmt_timestamp(at)),
                None => "never".to_owned(),
            },
        ),
        (
            "hits",
            match summary.last_hit_ms {
                Some(last) => format!("{}, last {}", summary.hit_count, fmt_since(last, now_ms)),
                None => summary.hit_count.to_string(),
            },
        ),
        ("ttft cost", fmt_opt_ms(summary.ttft_cost_ms)),
        ("size", fmt_bytes(summary.bytes)),
        (
            "tokens",
            format!("{} ({} stream events)", summary.tokens, entry.events),
        ),
        (
            "vector",
            if entry.has_vector { "yes" } else { "no" }.to_owned(),
        ),
        ("key", entry.key.clone()),
        ("partition", entry.partition.clone()),
    ];
    if let Some(usage) = &entry.usage {
        rows.push(("usage", usage.to_string()));
    }
    push_table(&mut out, &key_values(rows));
    out.push_str(&format!("\nPrompt\n{}\n", summary.prompt));
    out.push_str(&format!("\nAnswer\n{}\n", entry.answer));
    if let Some(phases) = &entry.phases {
        out.push_str("\nTimings of the miss that stored it\n");
        push_table(&mut out, &phases_table(phases));
    }
    out.push_str("\nHit history\n");
    if entry.hit_history.is_empty() {
        out.push_str("never hit\n");
        return out;
    }
    let mut hits = table(
        &[
            "WHEN",
            "KIND",
            "SIMILARITY",
            "TTFT",
            "TTFT SAVED",
            "REQUEST",
        ],
        &[2, 3, 4],
    );
    for hit in &entry.hit_history {
        hits.add_row(vec![
            fmt_since(hit.at_ms, now_ms),
            outcome_label(&hit.kind),
            hit.similarity
                .map(|s| format!("{s:.3}"))
                .unwrap_or_else(|| "-".to_owned()),
            fmt_opt_ms(hit.ttft_ms),
            fmt_opt_ms(hit.ttft_saved_ms),
            hit.request_id.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    push_table(&mut out, &hits);
    out
}

fn phases_table(phases: &Phases) -> Table {
    let mut rows = Vec::new();
    for (name, value) in [
        ("ingress", phases.ingress_ms),
        ("lookup", phases.lookup_ms),
        ("embed", phases.embed_ms),
        ("search", phases.search_ms),
        ("upstream send", phases.upstream_send_ms),
        ("ttft", phases.ttft_ms),
        ("decode", phases.decode_ms),
        ("downstream", phases.downstream_ms),
        ("total", Some(phases.total_ms)),
    ] {
        if let Some(ms) = value {
            rows.push((name, fmt_ms(ms)));
        }
    }
    let mut tokens = phases.tokens.to_string();
    if let Some(completion) = phases.completion_tokens {
        tokens.push_str(&format!(" ({completion} completion tokens reported)"));
    }
    rows.push(("tokens", tokens));
    if let (Some(p50), Some(p99)) = (phases.itl_p50_ms, phases.itl_p99_ms) {
        rows.push((
            "inter-token",
            format!("p50 {}, p99 {}", fmt_ms(p50), fmt_ms(p99)),
        ));
    }
    if let Some(rate) = phases.tokens_per_s {
        rows.push(("tokens/s", format!("{rate:.1}")));
    }
    key_values(rows)
}

/// `entries rm`: one line per deleted entry.
pub fn render_deleted(deleted: &EntryDeleted) -> String {
    if deleted.deleted {
        format!("deleted {}", deleted.id)
    } else {
        format!("{} was not deleted", deleted.id)
    }
}

/// `invalidate`.
pub fn render_invalidation(invalidation: &Invalidation) -> String {
    let noun = |n: u64| if n == 1 { "entry" } else { "entries" };
    if invalidation.dry_run {
        format!(
            "dry run: {} {} match; nothing deleted\n",
            invalidation.matched,
            noun(invalidation.matched)
        )
    } else {
        format!(
            "deleted {} of {} matching {}\n",
            invalidation.deleted,
            invalidation.matched,
            noun(invalidation.matched)
        )
    }
}

/// `flush --yes`.
pub fn render_flush(flush: &Flush) -> String {
    format!(
        "flushed the cache: {} {} deleted\n",
        flush.deleted,
        if flush.deleted == 1 {
            "entry"
        } else {
            "entries"
        }
    )
}

/// `warm FILE`.
pub fn render_warm(warm: &WarmResult) -> String {
    let mut out = format!(
        "warmed {} {}\n",
        warm.created,
        if warm.created == 1 {
            "entry"
        } else {
            "entries"
        }
    );
    if !warm.data.is_empty() {
        let mut created = table(&["ID", "PROMPT"], &[]);
        for entry in &warm.data {
            created.add_row(vec![entry.id.clone(), one_line(&entry.prompt, 72)]);
        }
        push_table(&mut out, &created);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_cli::tests::{fixture, NOW};

    #[test]
    fn warm_format_follows_flag_then_extension_then_content() {
        let lines = b"{\"model\":\"m\",\"prompt\":\"a\",\"response\":\"b\"}\n{\"model\":\"m\",\"prompt\":\"c\",\"response\":\"d\"}\n";
        assert_eq!(
            warm_format("items.jsonl", None, b"[]"),
            WarmFormat::JsonLines
        );
        assert_eq!(
            warm_format("items.NDJSON", None, b"[]"),
            WarmFormat::JsonLines
        );
        assert_eq!(warm_format("items.json", None, lines), WarmFormat::Json);
        assert_eq!(warm_format("-", None, lines), WarmFormat::JsonLines);
        assert_eq!(warm_format("-", None, b"[{}]"), WarmFormat::Json);
        assert_eq!(
            warm_format("items.jsonl", Some(WarmFileFormat::Json), lines),
            WarmFormat::Json
        );
    }

    #[test]
    fn entries_render_ages_hits_and_truncated_prompts() {
        let page: EntryPage = fixture(include_str!("../../tests/fixtures/entries_page.json"));
        let text = render_entries(&page, NOW);
        assert!(text.contains("e_00000000002a"), "{text}");
        assert!(text.contains("3m 12s"), "{text}");
        assert!(text.contains("2h 3m"), "{text}");
        assert!(text.contains("3m 15s ago"), "{text}"); // last hit 195 s before NOW
        assert!(text.contains("never"), "{text}");
        assert!(text.contains("411 ms"), "{text}");
        assert!(text.contains("warmed"), "{text}");
        assert!(text.contains("support"), "{text}");
        assert!(text.contains("What is the capital of France?"), "{text}");
        assert!(
            text.contains("Please summarise the following very long suppor…"),
            "{text}"
        );
        assert!(!text.contains("never arrived"), "{text}");
        assert!(!text.contains("SIMILARITY"), "{text}");
        assert!(
            text.contains("2 entries; more with --cursor e_000000000029 (or --all)"),
            "{text}"
        );
    }

    #[test]
    fn search_results_show_similarity() {
        let page: EntryPage = fixture(include_str!("../../tests/fixtures/entries_search.json"));
        assert_eq!(page.data[0].similarity, Some(0.93));
        let text = render_entries(&page, NOW);
        assert!(text.contains("SIMILARITY"), "{text}");
        assert!(text.contains("0.930"), "{text}");
        assert!(text.ends_with("1 entry\n"), "{text}");
    }

    #[test]
    fn entry_detail_renders_answer_phases_and_history() {
        let entry: EntryDetail = fixture(include_str!("../../tests/fixtures/entry_detail.json"));
        assert_eq!(entry.summary.id, "e_00000000002a");
        assert_eq!(entry.hit_history.len(), 2);
        let text = render_entry(&entry, NOW);
        for expected in [
            "e_00000000002a",
            "gpt-4o-mini",
            "2025-11-30T02:33:20Z",
            "3, last 3m 15s ago",
            "64 (65 stream events)",
            "\nPrompt\nWhat is the capital of France?\n",
            "\nAnswer\nThe capital of France is Paris.\n",
            "411 ms",
            "900 ms",
            "1319 ms",
            "p50 12.5 ms, p99 40.0 ms",
            "semantic hit",
            "0.940",
            "405 ms",
            "req_2",
            "\"completion_tokens\":8",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn small_results_render_one_line() {
        let deleted: EntryDeleted =
            fixture(include_str!("../../tests/fixtures/entry_deleted.json"));
        assert_eq!(render_deleted(&deleted), "deleted e_00000000002a");
        let invalidation: Invalidation =
            fixture(include_str!("../../tests/fixtures/invalidation.json"));
        assert_eq!(
            render_invalidation(&invalidation),
            "deleted 3 of 3 matching entries\n"
        );
        let dry = Invalidation {
            dry_run: true,
            deleted: 0,
            matched: 1,
            ..invalidation
        };
        assert_eq!(
            render_invalidation(&dry),
            "dry run: 1 entry match; nothing deleted\n"
        );
        let flush: Flush = fixture(include_str!("../../tests/fixtures/flush.json"));
        assert_eq!(
            render_flush(&flush),
            "flushed the cache: 12 entries deleted\n"
        );
        let warm: WarmResult = fixture(include_str!("../../tests/fixtures/warm_result.json"));
        let text = render_warm(&warm);
        assert!(text.starts_with("warmed 2 entries\n"), "{text}");
        assert!(
            text.contains("e_000000000031") && text.contains("Who wrote Hamlet?"),
            "{text}"
        );
    }
}
