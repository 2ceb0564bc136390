//! `reprise-client eval`: its flags and what the command does with them. Lives in the library so the
//! binary only adds a subcommand variant and a dispatch line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super::pairs::{self, Ambiguous};
use super::{report, EvalConfig};
use crate::api::Api;

#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    /// Gateway URL, its root or its /v1 base URL.
    #[arg(long, env = "REPRISE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// JSON Lines files of labeled pairs (`a`, `b`, `same_answer`, optional `category`/`subtype`, `id`, `ambiguous`).
    #[arg(long, required = true, num_args = 1..)]
    pub pairs: Vec<PathBuf>,
    /// Pairs evaluated at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Model name sent in every request (part of the cache partition).
    #[arg(long, default_value = "reprise-eval")]
    pub model: String,
    /// API the pairs are sent through: `openai` (chat completions) or `anthropic` (the Messages
    /// API, `POST /v1/messages` with `x-api-key`, `anthropic-version: 2023-06-01`, `max_tokens`
    /// 256; system messages of a conversation become the top-level `system`).
    #[arg(long, value_enum, default_value_t = Api::Openai)]
    pub api: Api,
    /// API key sent as the bearer token (`--api openai`) or as `x-api-key` (`--api anthropic`).
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        default_value = "sk-reprise-eval",
        hide_env_values = true
    )]
    pub api_key: String,
    /// Only the first N pairs (over all files, in order).
    #[arg(long)]
    pub limit: Option<usize>,
    /// How pairs marked `ambiguous` count: different (as traps), same (as should-hit), skip.
    #[arg(long, default_value = "different")]
    pub ambiguous: Ambiguous,
    /// Title of the report [default: the file names].
    #[arg(long)]
    pub title: Option<String>,
    /// Print the summary as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write eval.md, threshold-curve.svg and results.jsonl into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Fail when more than this share of pairs could not be measured.
    #[arg(long, default_value_t = 0.01)]
    pub max_error_share: f64,
    /// Seconds `a` may take to become visible in the cache.
    #[arg(long, default_value_t = 10.0)]
    pub store_timeout_s: f64,
}

/// Runs the command: exit 0 on success, 1 when the run failed or too many pairs errored, 2 for bad input.
pub async fn run(args: EvalArgs) -> ExitCode {
    let (evaluation, summary) = match evaluate(&args, "eval").await {
        Ok(done) => done,
        Err(code) => return code,
    };
    if args.json {
        match serde_json::to_string_pretty(&summary) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("reprise-client eval: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report::render_text(&summary));
    }
    finish(&args, &summary, &evaluation, "eval")
}

/// Reads the pairs, runs them through the gateway and summarizes them; errors are printed, prefixed
/// with `command`, and come back as the exit code.
pub async fn evaluate(
    args: &EvalArgs,
    command: &str,
) -> Result<(super::Evaluation, report::Summary), ExitCode> {
    let mut all = Vec::new();
    for path in &args.pairs {
        match pairs::read_file(path, args.ambiguous) {
            Ok(mut p) => all.append(&mut p),
            Err(err) => {
                eprintln!("reprise-client {command}: {err}");
                return Err(ExitCode::from(2));
            }
        }
    }
    if let Some(limit) = args.limit {
        all.truncate(limit);
    }
    if all.is_empty() {
        eprintln!("reprise-client {command}: no pairs to evaluate");
        return Err(ExitCode::from(2));
    }
    if !(args.store_timeout_s.is_finite() && args.store_timeout_s > 0.0) {
        eprintln!(
            "reprise-client {command}: --store-timeout-s must be a positive number of seconds"
        );
        return Err(ExitCode::from(2));
    }
    let title = args.title.clone().unwrap_or_else(|| {
        args.pairs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    });
    let config = EvalConfig {
        root: super::root_url(&args.url),
        api: args.api,
        api_key: args.api_key.clone(),
        model: args.model.clone(),
        concurrency: args.concurrency.max(1),
        run_id: run_id(),
        store_timeout: Duration::from_secs_f64(args.store_timeout_s),
        request_timeout: Duration::from_secs(120),
    };
    let total = all.len();
    let quiet = args.json;
    let evaluation = match super::run(&config, all, move |done| {
        if !quiet && (done % 50 == 0 || done == total) {
            eprint!("\r{done}/{total} pairs");
        }
    })
    .await
    {
        Ok(e) => e,
        Err(err) => {
            eprintln!("reprise-client {command}: {err}");
            return Err(ExitCode::FAILURE);
        }
    };
    if !quiet {
        eprintln!();
    }
    let summary = report::summarize(&evaluation, &title);
    Ok((evaluation, summary))
}

/// Writes the report folder when asked, and fails when too many pairs could not be measured.
pub fn finish(
    args: &EvalArgs,
    summary: &report::Summary,
    evaluation: &super::Evaluation,
    command: &str,
) -> ExitCode {
    if let Some(dir) = &args.report {
        if let Err(err) = report::write_dir(dir, summary, evaluation) {
            eprintln!("reprise-client {command}: {err}");
            return ExitCode::FAILURE;
        }
        if !args.json {
            eprintln!("report written to {}", dir.display());
        }
    }
    let total = evaluation.results.len();
    let errors = summary.overall.errors;
    if errors as f64 > args.max_error_share * total as f64 {
        eprintln!(
            "reprise-client {command}: {errors} of {total} pairs could not be measured (more than {:.1}%); first: {}",
            args.max_error_share * 100.0,
            summary.failures.first().map_or("", String::as_str)
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// A run id unlikely to repeat, so namespaces of different runs never meet.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:x}{:04x}", nanos / 1_000_000, rand::random::<u16>())
}
