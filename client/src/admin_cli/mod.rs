//! The admin subcommands of `reprise-client` (`stats`, `entries`, `invalidate`, `flush`, `warm`,
//! `config`, `requests`, `metrics`): their arguments, how each one calls [`crate::admin`], and the
//! human-readable tables they print.
//!
//! Rendering is a set of pure functions from contract types to text, so it is tested without a
//! gateway; `--json` bypasses it and prints the response exactly as the gateway sent it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{presets, CellAlignment, Table};
use serde_json::value::RawValue;

use crate::admin::{
    decode, truncate_chars, AdminCall, AdminClient, AdminError, Completion, ConfigPatch,
    EntryDeleted, EntryDetail, EntryPage, EntrySummary, FeedbackPage, FeedbackRequest, Flush,
    InvalidateRequest, Invalidation, ListQuery, LiveConfig, Phases, RequestsPage, ShadowPage,
    ShadowQuery, Stats, Summary, VerdictRecord, WarmFormat, WarmResult, DEFAULT_URL, TOKEN_ENV,
    URL_ENV,
};

/// How to reach the gateway and how to print; accepted before or after a nested subcommand.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Gateway")]
pub struct GatewayArgs {
    /// Gateway URL; a trailing /v1 is ignored, so the OpenAI base URL works too.
    #[arg(long, global = true, env = URL_ENV, default_value = DEFAULT_URL)]
    pub url: String,
    /// Admin bearer token (the gateway's --admin-token).
    #[arg(long, global = true, env = TOKEN_ENV, hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Print the gateway's JSON response, pretty-printed, instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

impl GatewayArgs {
    pub fn client(&self) -> Result<AdminClient, AdminError> {
        AdminClient::new(&self.url, self.admin_token.as_deref())
    }
}

/// The admin subcommands, flattened into the binary's top-level commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Counts, hit rates, TTFT saved and per-outcome latency.
    Stats(StatsArgs),
    /// List, show, delete and search cached entries.
    Entries(EntriesArgs),
    /// Delete the entries matching all the given filters.
    Invalidate(InvalidateArgs),
    /// Delete every cached entry (needs --yes).
    Flush(FlushArgs),
    /// Pre-load entries from a file: .jsonl/.ndjson (one item per line) or .json; - reads stdin.
    Warm(WarmArgs),
    /// Show or change the live configuration (thresholds, TTL, replay, cache mode).
    Config(ConfigArgs),
    /// The most recent requests with their cache outcome and timings.
    Requests(RequestsArgs),
    /// The Prometheus metrics text.
    Metrics(MetricsArgs),
    /// What shadow mode would have served: candidate, similarity, threshold, each guard's verdict.
    Shadow(ShadowArgs),
    /// Judge a semantic hit or shadow decision by request id (`right` or `wrong`); without
    /// arguments, list the verdicts.
    Feedback(FeedbackArgs),
}

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
    Show { id: String },
    /// Delete entries by id.
    #[command(visible_alias = "delete")]
    Rm {
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
    pub query: String,
    #[arg(long)]
    pub limit: Option<u32>,
    #[arg(long)]
    pub namespace: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
}

#[derive(Debug, Args)]
pub struct InvalidateArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[arg(long)]
    pub namespace: Option<String>,
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

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(subcommand)]
    pub command: Option<ConfigCommand>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Show the live configuration (the default).
    Get,
    /// Change settings: similarity_threshold=0.92 default_ttl_s=1d replay=recorded
    /// cache_mode=read-only semantic_guards=numbers,negation,direction,antonym|none
    /// namespace_thresholds.support=0.95 namespace_modes.support=shadow (=null removes one).
    Set {
        #[arg(required = true, value_name = "KEY=VALUE")]
        assignments: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct RequestsArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// How many (gateway default 100).
    #[arg(long)]
    pub limit: Option<u32>,
}

/// Why an admin subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The command line asks for something that cannot be done as asked.
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    /// Some of several deletions failed (the others went through).
    #[error("{} of {total} deletions failed: {}", .failures.len(), .failures.iter().map(|(id, e)| format!("{id}: {e}")).collect::<Vec<_>>().join("; "))]
    Deletions {
        total: usize,
        failures: Vec<(String, AdminError)>,
    },
}

impl CliError {
    /// True when stdout was closed early (e.g. `| head`): not worth a message or a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// 2 for command-line mistakes (as clap uses), 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            Self::Admin(_) | Self::Read { .. } | Self::Output(_) | Self::Deletions { .. } => 1,
        }
    }
}

/// Runs one admin subcommand, writing its result to `out`.
pub async fn run(command: AdminCommand, out: &mut dyn Write) -> Result<(), CliError> {
    let now = now_ms();
    match command {
        AdminCommand::Stats(args) => {
            show(out, &args.gateway, AdminCall::Stats, |stats: Stats| {
                render_stats(&stats)
            })
            .await
        }
        AdminCommand::Entries(args) => run_entries(args, out, now).await,
        AdminCommand::Invalidate(args) => {
            let request = InvalidateRequest {
                namespace: args.namespace,
                model: args.model,
                tenant: args.tenant,
                older_than_s: args.older_than,
                similar_to: args.similar_to,
                min_similarity: args.min_similarity,
                dry_run: args.dry_run,
            };
            // The gateway refuses this too; saying it here also points at the right command.
            let filtered = request.namespace.is_some()
                || request.model.is_some()
                || request.tenant.is_some()
                || request.older_than_s.is_some()
                || request.similar_to.is_some();
            if !filtered {
                return Err(CliError::Usage(
                    "invalidate needs at least one filter (--namespace, --model, --tenant, \
                     --older-than, --similar-to); to delete everything use `flush --yes`"
                        .to_owned(),
                ));
            }
            let call = AdminCall::Invalidate(request);
            show(out, &args.gateway, call, |inv: Invalidation| {
                render_invalidation(&inv)
            })
            .await
        }
        AdminCommand::Flush(args) => {
            if !args.yes {
                return Err(CliError::Usage(
                    "refusing to flush: this deletes every cached entry; run `flush --yes` to \
                     confirm (or `invalidate` to delete only some)"
                        .to_owned(),
                ));
            }
            show(out, &args.gateway, AdminCall::Flush, |flush: Flush| {
                render_flush(&flush)
            })
            .await
        }
        AdminCommand::Warm(args) => {
            let body = read_input(&args.file)?;
            let format = warm_format(&args.file, args.format, &body);
            let call = AdminCall::WarmRaw {
                body: body.into(),
                format,
            };
            show(out, &args.gateway, call, |warm: WarmResult| {
                render_warm(&warm)
            })
            .await
        }
        AdminCommand::Config(args) => {
            let call = match args.command {
                None | Some(ConfigCommand::Get) => AdminCall::Config,
                Some(ConfigCommand::Set { assignments }) => {
                    AdminCall::PatchConfig(parse_config_patch(&assignments)?)
                }
            };
            show(out, &args.gateway, call, |config: LiveConfig| {
                render_config(&config)
            })
            .await
        }
        AdminCommand::Requests(args) => {
            let call = AdminCall::Requests { limit: args.limit };
            show(out, &args.gateway, call, |page: RequestsPage| {
                render_requests(&page, now)
            })
            .await
        }
        AdminCommand::Metrics(args) => {
            let text = args.gateway.client()?.metrics().await?;
            out.write_all(text.as_bytes())?;
            Ok(())
        }
        AdminCommand::Shadow(args) => {
            let call = AdminCall::Shadow(ShadowQuery {
                namespace: args.namespace,
                would: args.would,
                limit: args.limit,
                cursor: args.cursor,
            });
            show(out, &args.gateway, call, |page: ShadowPage| {
                render_shadow(&page, now)
            })
            .await
        }
        AdminCommand::Feedback(args) => match (args.request_id, args.verdict) {
            (Some(request_id), Some(verdict)) => {
                let call = AdminCall::Feedback(FeedbackRequest {
                    request_id,
                    verdict,
                });
                show(out, &args.gateway, call, |record: VerdictRecord| {
                    render_verdict(&record)
                })
                .await
            }
            _ => {
                let call = AdminCall::FeedbackList {
                    limit: args.limit,
                    cursor: None,
                };
                show(out, &args.gateway, call, |page: FeedbackPage| {
                    render_feedback(&page, now)
                })
                .await
            }
        },
    }
}

async fn run_entries(args: EntriesArgs, out: &mut dyn Write, now: u64) -> Result<(), CliError> {
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

/// Performs `call` and prints the answer: as JSON with `--json`, else decoded into its contract
/// type and rendered.
async fn show<T: serde::de::DeserializeOwned>(
    out: &mut dyn Write,
    gateway: &GatewayArgs,
    call: AdminCall,
    render: impl FnOnce(T) -> String,
) -> Result<(), CliError> {
    let body = gateway.client()?.call_raw(&call).await?;
    emit(out, gateway, &call.describe(), &body, render)
}

/// Prints `body` pretty-printed with `--json`, else decodes it into its contract type and renders it.
fn emit<T: serde::de::DeserializeOwned>(
    out: &mut dyn Write,
    gateway: &GatewayArgs,
    call: &str,
    body: &[u8],
    render: impl FnOnce(T) -> String,
) -> Result<(), CliError> {
    if gateway.json {
        let text = pretty_json(body).map_err(|e| AdminError::Decode {
            call: call.to_owned(),
            detail: format!("the body is not JSON ({e})"),
        })?;
        writeln!(out, "{text}")?;
    } else {
        let typed = decode(body, call)?;
        out.write_all(render(typed).as_bytes())?;
    }
    Ok(())
}

/// `body` re-indented, with its keys in the order the gateway sent them (going through
/// `serde_json::Value` would sort them).
pub fn pretty_json(body: &[u8]) -> Result<String, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let mut text = Vec::new();
    let mut serializer = serde_json::Serializer::pretty(&mut text);
    serde_transcode::transcode(&mut deserializer, &mut serializer)?;
    deserializer.end()?;
    // The serializer only writes what the deserializer read, which was valid UTF-8 JSON.
    Ok(String::from_utf8_lossy(&text).into_owned())
}

/// Several raw JSON documents as one pretty-printed JSON array.
fn pretty_array(items: &[Box<RawValue>]) -> Result<String, serde_json::Error> {
    pretty_json(serde_json::to_string(items)?.as_bytes())
}

fn read_input(path: &str) -> Result<Vec<u8>, CliError> {
    let mut body = Vec::new();
    let result = if path == "-" {
        std::io::stdin().read_to_end(&mut body).map(|_| ())
    } else {
        std::fs::read(path).map(|bytes| body = bytes)
    };
    result.map_err(|source| CliError::Read {
        path: if path == "-" {
            "standard input".to_owned()
        } else {
            path.to_owned()
        },
        source,
    })?;
    Ok(body)
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

/// Whole seconds from `3600`, `3600s`, `30m`, `1h`, `2d`, `1h 30m`.
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(seconds);
    }
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 1h, 30m, 3600s or 3600 ({e})"))?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{text:?} is not a whole number of seconds"));
    }
    Ok(duration.as_secs())
}

/// Builds a config PATCH from `key=value` arguments.
pub fn parse_config_patch(assignments: &[String]) -> Result<ConfigPatch, CliError> {
    const KEYS: &str = "similarity_threshold, default_ttl_s, replay, cache_mode, \
                        semantic_guards, namespace_thresholds.NAME, namespace_modes.NAME";
    let mut patch = ConfigPatch::default();
    for assignment in assignments {
        let Some((key, value)) = assignment.split_once('=') else {
            return Err(CliError::Usage(format!(
                "{assignment:?} is not KEY=VALUE (keys: {KEYS})"
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        let threshold = |value: &str| {
            value
                .parse::<f32>()
                .map_err(|_| CliError::Usage(format!("{key}: {value:?} is not a number like 0.92")))
        };
        match key {
            "similarity_threshold" => patch.similarity_threshold = Some(threshold(value)?),
            "default_ttl_s" => {
                patch.default_ttl_s =
                    Some(parse_seconds(value).map_err(|e| CliError::Usage(format!("{key}: {e}")))?)
            }
            "replay" => patch.replay = Some(value.to_owned()),
            "cache_mode" => patch.cache_mode = Some(value.to_owned()),
            "semantic_guards" => patch.semantic_guards = Some(value.to_owned()),
            _ if key.starts_with("namespace_modes.") && key.len() > "namespace_modes.".len() => {
                let namespace = &key["namespace_modes.".len()..];
                let mode = match value {
                    "null" | "none" | "" => None,
                    value => Some(value.to_owned()),
                };
                patch
                    .namespace_modes
                    .get_or_insert_with(BTreeMap::new)
                    .insert(namespace.to_owned(), mode);
            }
            _ => match key.strip_prefix("namespace_thresholds.") {
                Some(namespace) if !namespace.is_empty() => {
                    // `null` (or `none`, or nothing) removes the namespace's own threshold.
                    let threshold = match value {
                        "null" | "none" | "" => None,
                        value => Some(threshold(value)?),
                    };
                    patch
                        .namespace_thresholds
                        .get_or_insert_with(BTreeMap::new)
                        .insert(namespace.to_owned(), threshold);
                }
                _ => {
                    return Err(CliError::Usage(format!(
                        "unknown config key {key:?} (keys: {KEYS})"
                    )))
                }
            },
        }
    }
    Ok(patch)
}

// ---------------------------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------------------------

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds with precision that fits their size: `0.42 ms`, `5.10 ms`, `41.2 ms`, `411 ms`, `12.3 s`.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 100.0 {
        format!("{ms:.1} ms")
    } else if ms < 10_000.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{:.1} s", ms / 1000.0)
    }
}

fn fmt_opt_ms(ms: Option<f64>) -> String {
    ms.map(fmt_ms).unwrap_or_else(|| "-".to_owned())
}

/// A 0..=1 share as a percentage.
pub fn fmt_pct(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// An age as its two largest units: `12s`, `3m 12s`, `2h 3m`, `6days 23h`.
pub fn fmt_age(seconds: f64) -> String {
    let whole = Duration::from_secs(seconds.max(0.0).round() as u64);
    let text = humantime::format_duration(whole).to_string();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn fmt_since(then_ms: u64, now_ms: u64) -> String {
    format!(
        "{} ago",
        fmt_age(now_ms.saturating_sub(then_ms) as f64 / 1000.0)
    )
}

fn fmt_timestamp(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Bytes in binary units: `512 B`, `33.8 KiB`, `1.2 MiB`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// One line of a prompt for a table cell: whitespace collapsed, at most `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    truncate_chars(&text.split_whitespace().collect::<Vec<_>>().join(" "), max)
}

/// Table style: no borders, no column separators, only a rule under the header (like `kubectl`).
const RULE_UNDER_HEADER: &str = "     ─             ";

/// A borderless table with a rule under the header; `right` lists the columns that hold numbers.
fn table(header: &[&str], right: &[usize]) -> Table {
    let mut table = Table::new();
    table.load_preset(RULE_UNDER_HEADER);
    table.set_header(header.to_vec());
    for (index, column) in table.column_iter_mut().enumerate() {
        // Two spaces between columns and none before the first keeps lines copy-pasteable.
        column.set_padding((0, 2));
        if right.contains(&index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// Two columns, name and value, without a header.
fn key_values(rows: Vec<(&str, String)>) -> Table {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING);
    for (key, value) in rows {
        table.add_row(vec![key.to_owned(), value]);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// Appends `table` line by line. comfy-table pads every line to the full width, trailing padding
/// included, which is noise at the end of a line (and in copy-paste): trailing spaces go, and the
/// header rule is cut to the longest line.
fn push_table(out: &mut String, table: &Table) {
    let lines: Vec<String> = table.lines().map(|l| l.trim_end().to_owned()).collect();
    let is_rule = |line: &str| !line.is_empty() && line.chars().all(|c| c == '─');
    let width = lines
        .iter()
        .filter(|l| !is_rule(l))
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    for line in lines {
        if is_rule(&line) {
            out.extend(std::iter::repeat_n('─', width));
        } else {
            out.push_str(&line);
        }
        out.push('\n');
    }
}

// ---------------------------------------------------------------------------------------------
// Renderers
// ---------------------------------------------------------------------------------------------

/// Outcomes in the order an operator reads them: the cheap ones first.
const OUTCOMES: [&str; 4] = ["hit", "semantic-hit", "coalesced", "miss"];

fn outcome_label(outcome: &str) -> String {
    outcome.replace('-', " ")
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
                "{} vectors, {} tombstones{}",
                index.vectors,
                index.tombstones,
                if index.rebuilding { ", rebuilding" } else { "" }
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

/// `config` and `config set`.
pub fn render_config(config: &LiveConfig) -> String {
    let mut rows = vec![
        (
            "similarity_threshold",
            format!("{}", config.similarity_threshold),
        ),
        (
            "default_ttl_s",
            match config.default_ttl_s {
                Some(ttl) => format!("{ttl} ({})", fmt_age(ttl as f64)),
                None => "none (entries do not expire)".to_owned(),
            },
        ),
        ("replay", config.replay.clone()),
        ("cache_mode", config.cache_mode.clone()),
        ("semantic_guards", config.semantic_guards.clone()),
    ];
    let namespaces: Vec<String> = config
        .namespace_thresholds
        .iter()
        .map(|(namespace, threshold)| format!("{namespace}={threshold}"))
        .collect();
    rows.push((
        "namespace_thresholds",
        if namespaces.is_empty() {
            "none".to_owned()
        } else {
            namespaces.join(", ")
        },
    ));
    let modes: Vec<String> = config
        .namespace_modes
        .iter()
        .map(|(namespace, mode)| format!("{namespace}={mode}"))
        .collect();
    rows.push((
        "namespace_modes",
        if modes.is_empty() {
            "none".to_owned()
        } else {
            modes.join(", ")
        },
    ));
    let mut out = String::new();
    push_table(&mut out, &key_values(rows));
    out
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

/// `requests`.
pub fn render_requests(page: &RequestsPage, now_ms: u64) -> String {
    let mut out = String::new();
    if page.data.is_empty() {
        out.push_str("no requests yet\n");
        return out;
    }
    let mut requests = table(
        &[
            "ID", "AGE", "ROUTE", "MODEL", "STATUS", "CACHE", "TTFT", "TOTAL", "SAVED", "ENTRY",
        ],
        &[4, 6, 7, 8],
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
            record.entry.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    push_table(&mut out, &requests);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture<T: serde::de::DeserializeOwned>(text: &str) -> T {
        match serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text)) {
            Ok(value) => value,
            Err(e) => panic!("fixture does not decode at {}: {}", e.path(), e.inner()),
        }
    }

    /// 2025-11-30T02:33:20Z plus 200 s, so ages in the fixtures are known.
    const NOW: u64 = 1_764_470_200_000;

    #[test]
    fn seconds_accept_units_and_plain_numbers() {
        assert_eq!(parse_seconds("3600"), Ok(3600));
        assert_eq!(parse_seconds("3600s"), Ok(3600));
        assert_eq!(parse_seconds("30m"), Ok(1800));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        assert_eq!(parse_seconds("1h 30m"), Ok(5400));
        assert_eq!(parse_seconds("2d"), Ok(172_800));
        assert_eq!(parse_seconds(" 7 "), Ok(7));
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("-5").is_err());
        assert!(parse_seconds("1500ms")
            .expect_err("subsecond")
            .contains("whole number of seconds"));
    }

    #[test]
    fn pretty_json_keeps_key_order_and_rejects_non_json() {
        let text = pretty_json(br#"{"z":1,"a":{"y":[1,2],"b":null}}"#).expect("json");
        assert_eq!(
            text,
            "{\n  \"z\": 1,\n  \"a\": {\n    \"y\": [\n      1,\n      2\n    ],\n    \"b\": null\n  }\n}"
        );
        assert!(pretty_json(b"<html>").is_err());
        assert!(pretty_json(b"{} {}").is_err());
    }

    #[test]
    fn numbers_are_formatted_for_people() {
        assert_eq!(fmt_ms(0.42), "0.42 ms");
        assert_eq!(fmt_ms(5.1), "5.10 ms");
        assert_eq!(fmt_ms(41.25), "41.2 ms");
        assert_eq!(fmt_ms(411.2), "411 ms");
        assert_eq!(fmt_ms(12345.6), "12.3 s");
        assert_eq!(fmt_pct(0.613), "61.3%");
        assert_eq!(fmt_pct(0.0), "0.0%");
        assert_eq!(fmt_age(192.0), "3m 12s");
        assert_eq!(fmt_age(12.0), "12s");
        assert_eq!(fmt_age(7384.0), "2h 3m");
        assert_eq!(fmt_age(0.0), "0s");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(34567), "33.8 KiB");
        assert_eq!(fmt_bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("abcdefghijkl", 5), "abcd…");
    }

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
    fn config_assignments_build_a_patch() {
        let args: Vec<String> = [
            "similarity_threshold=0.92",
            "default_ttl_s=1d",
            "replay=tokens-per-second=40",
            "cache_mode=read-only",
            "semantic_guards=none",
            "namespace_thresholds.support=0.95",
            "namespace_thresholds.legal=null",
            "namespace_modes.support=shadow",
            "namespace_modes.legal=null",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let patch = parse_config_patch(&args).expect("patch");
        assert_eq!(
            serde_json::to_value(&patch).expect("json"),
            serde_json::json!({
                "similarity_threshold": 0.92_f32,
                "default_ttl_s": 86400,
                "replay": "tokens-per-second=40",
                "cache_mode": "read-only",
                "semantic_guards": "none",
                "namespace_thresholds": {"support": 0.95_f32, "legal": null},
                "namespace_modes": {"support": "shadow", "legal": null}
            })
        );
        for bad in [
            "threshold=0.9",
            "similarity_threshold",
            "similarity_threshold=high",
            "namespace_thresholds.=0.9",
        ] {
            let err = parse_config_patch(&[bad.to_owned()]).expect_err(bad);
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
        }
    }

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
        let deleted: EntryDeleted = fixture(include_str!("../../tests/fixtures/entry_deleted.json"));
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

    #[test]
    fn config_renders_every_setting() {
        let config: LiveConfig = fixture(include_str!("../../tests/fixtures/config.json"));
        let text = render_config(&config);
        for expected in [
            "similarity_threshold",
            "0.9",
            "604800 (7days)",
            "instant",
            "cache_mode",
            "support=0.95",
            "numbers,negation",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

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
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
