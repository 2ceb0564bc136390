//! The admin subcommands of `reprise-client` (`stats`, `entries`, `invalidate`, `flush`, `warm`,
//! `config`, `requests`, `metrics`): their arguments, how each one calls [`crate::admin`], and the
//! human-readable tables they print.
//!
//! Rendering is a set of pure functions from contract types to text, so it is tested without a
//! gateway; `--json` bypasses it and prints the response exactly as the gateway sent it.

//!
//! One file per command group: [`stats`] (`stats`, `metrics`), [`entries`] (`entries`,
//! `invalidate`, `flush`, `warm`), [`config`], [`learn`] (`shadow`, `feedback`), [`requests`]; each
//! holds its arguments and its tables, [`format`] the number formats and table builders they share.
//! This file holds the command enum, the dispatcher and the `--json` path.

pub mod config;
pub mod entries;
pub mod format;
pub mod learn;
pub mod requests;
pub mod stats;

use std::io::{Read, Write};

use clap::{Args, Subcommand};
use serde_json::value::RawValue;

pub use config::{parse_config_patch, parse_seconds, render_config, ConfigArgs, ConfigCommand};
pub use entries::{
    render_deleted, render_entries, render_entry, render_flush, render_invalidation, render_warm,
    warm_format, EntriesArgs, EntriesCommand, FlushArgs, InvalidateArgs, LsArgs, SearchArgs,
    WarmArgs, WarmFileFormat,
};
pub use format::{fmt_age, fmt_bytes, fmt_ms, fmt_pct, one_line};
pub use learn::{render_feedback, render_shadow, render_verdict, FeedbackArgs, ShadowArgs};
pub use requests::{render_requests, RequestsArgs};
pub use stats::{render_stats, MetricsArgs, StatsArgs};

use crate::admin::{
    decode, AdminCall, AdminClient, AdminError, FeedbackPage, FeedbackRequest, Flush,
    InvalidateRequest, Invalidation, LiveConfig, RequestsPage, ShadowPage, ShadowQuery, Stats,
    VerdictRecord, WarmResult, DEFAULT_URL, TOKEN_ENV, URL_ENV,
};
use entries::run_entries;
use format::now_ms;

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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn fixture<T: serde::de::DeserializeOwned>(text: &str) -> T {
        match serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text)) {
            Ok(value) => value,
            Err(e) => panic!("fixture does not decode at {}: {}", e.path(), e.inner()),
        }
    }

    /// 2025-11-30T02:33:20Z plus 200 s, so ages in the fixtures are known.
    pub(super) const NOW: u64 = 1_764_470_200_000;

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
}
