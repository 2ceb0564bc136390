//! `reprise-client`: command line over the client library: the benchmark driver and the admin
//! subcommands (whose arguments, calls and tables live in `reprise_client::admin_cli`).

use std::time::Duration;

use clap::{Parser, Subcommand};
use reprise_client::admin_cli::{self, AdminCommand};
use reprise_client::bench::{self, BenchConfig};

#[derive(Debug, Parser)]
#[command(
    name = "reprise-client",
    version,
    about = "Reprise client: benchmarks and admin"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure TTFT and total time against an OpenAI-compatible base URL (optionally two, side by side).
    Bench(BenchArgs),
    #[command(flatten)]
    Admin(AdminCommand),
    /// Match quality through a running gateway: store `a`, look up `b` for each labeled pair.
    Eval(reprise_client::eval::cli::EvalArgs),
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Base URL including /v1 (the gateway, reprise-sim, or any OpenAI-compatible server).
    #[arg(long, env = "REPRISE_URL", default_value = "http://127.0.0.1:8080/v1")]
    url: String,
    /// A second base URL measured in the same run with the same prompts (e.g. the direct upstream).
    #[arg(long)]
    compare: Option<String>,
    /// API key sent as the bearer token.
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        default_value = "sk-reprise-bench",
        hide_env_values = true
    )]
    api_key: String,
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Measured requests per target.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Concurrent workers (closed loop).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Warm-up requests per target, not measured.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Send non-streaming requests.
    #[arg(long)]
    no_stream: bool,
    /// Stop after this many seconds even if requests remain.
    #[arg(long, default_value_t = 300)]
    max_seconds: u64,
    /// Cycle over this many distinct prompts, so that repeats can be served from a cache.
    #[arg(long)]
    unique_prompts: Option<usize>,
    /// Send these prompts, one per line, in order (cycled).
    #[arg(long)]
    prompts_file: Option<std::path::PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Admin(command) => {
            let mut stdout = std::io::stdout().lock();
            match admin_cli::run(command, &mut stdout).await {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(err) if err.is_broken_pipe() => std::process::ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("reprise-client: {err}");
                    std::process::ExitCode::from(err.exit_code())
                }
            }
        }
        Command::Eval(args) => reprise_client::eval::cli::run(args).await,
        Command::Bench(args) => {
            let mut targets = vec![args.url.trim_end_matches('/').to_owned()];
            if let Some(second) = args.compare {
                targets.push(second.trim_end_matches('/').to_owned());
            }
            let prompts = match &args.prompts_file {
                Some(path) => match std::fs::read_to_string(path) {
                    Ok(text) => Some(std::sync::Arc::new(
                        text.lines()
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(str::to_owned)
                            .collect::<Vec<_>>(),
                    )),
                    Err(err) => {
                        eprintln!("reprise-client: cannot read {}: {err}", path.display());
                        return std::process::ExitCode::from(2);
                    }
                },
                None => None,
            };
            let config = BenchConfig {
                targets,
                api_key: args.api_key,
                model: args.model,
                requests: args.requests,
                concurrency: args.concurrency.max(1),
                stream: !args.no_stream,
                warmup: args.warmup,
                run_id: format!("{:x}", std::process::id() ^ (reprise_now() as u32)),
                max_duration: Duration::from_secs(args.max_seconds),
                unique_prompts: args.unique_prompts,
                prompts,
            };
            let total = config.requests;
            let quiet = args.json;
            let report = bench::run(config, move |done| {
                if !quiet && (done % 50 == 0 || done == total) {
                    eprint!("\r{done}/{total} requests");
                }
            })
            .await;
            if !quiet {
                eprintln!();
            }
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("reprise-client: {err}");
                        return std::process::ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", bench::render(&report));
            }
            if report
                .targets
                .iter()
                .any(|t| t.errors == t.requests && t.requests > 0)
            {
                eprintln!("reprise-client: every request to a target failed");
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
    }
}

fn reprise_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The bench and the admin subcommands share one parser: clap's own checks catch clashing flags.
    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
