//! `reprise-sim`: command line of the simulated OpenAI-compatible upstream (see `reprise_sim`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use reprise_sim::{self as sim, Fault, JudgeLabels, Profile, SimConfig};

#[derive(Debug, Parser)]
#[command(
    name = "reprise-sim",
    version,
    about = "A simulated OpenAI-compatible upstream for tests and benchmarks"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "REPRISE_SIM_LISTEN", default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Latency preset; the flags below override its figures.
    #[arg(long, value_enum)]
    profile: Option<Profile>,
    /// Time to first token before prefill, ms [default: 50, or the profile's].
    #[arg(long)]
    ttft_ms: Option<f64>,
    /// Inter-token latency, ms [default: 5, or the profile's].
    #[arg(long)]
    itl_ms: Option<f64>,
    /// Completion tokens per answer [default: 32, or 64 with a profile].
    #[arg(long)]
    tokens: Option<u32>,
    /// Prefill speed in prompt tokens per second; 0 turns it off [default: 0, or the profile's].
    #[arg(long)]
    prefill_tokens_per_s: Option<f64>,
    /// Random scale of every delay, 0..1 (0.1 = ±10%).
    #[arg(long, default_value_t = 0.0)]
    jitter: f64,
    /// Fault for every request: status=CODE, overloaded (529), rate-limit (429), hang, cut[=N], abort[=N],
    /// malformed[=N], error-event[=N], bad-tool-args, redirect, content-filter, error-frame[=N], bad-utf8[=N],
    /// stall-at-done, failed[=N], refusal (close-early and garbage-status are per request only, as the
    /// `x-sim-fault` header).
    #[arg(long)]
    fault: Option<Fault>,
    /// Labeled pairs (JSON Lines: `a`, `b`, `same_answer`, optional `ambiguous`, the eval's format) that
    /// judge calls are answered from; without it every judged pair is unknown, so `different`.
    #[arg(long)]
    judge_labels: Option<PathBuf>,
    /// Share of known pairs the judge gets right, 0..1; the others are flipped same <-> different.
    #[arg(long, default_value_t = 1.0)]
    judge_accuracy: f64,
    /// Seed of the per-pair draw that decides which verdicts are flipped.
    #[arg(long, default_value_t = 0)]
    judge_seed: u64,
    /// Delay before a judge call is answered, ms.
    #[arg(long, default_value_t = 0.0)]
    judge_latency_ms: f64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let mut config = args
        .profile
        .map_or_else(SimConfig::default, SimConfig::from_profile);
    if let Some(v) = args.ttft_ms {
        config.ttft_ms = v;
    }
    if let Some(v) = args.itl_ms {
        config.itl_ms = v;
    }
    if let Some(v) = args.tokens {
        config.tokens = v;
    }
    if let Some(v) = args.prefill_tokens_per_s {
        config.prefill_tokens_per_s = v;
    }
    config.jitter = args.jitter;
    config.fault = args.fault;
    if !(0.0..=1.0).contains(&args.judge_accuracy) {
        eprintln!("reprise-sim: --judge-accuracy must be between 0 and 1");
        return std::process::ExitCode::from(2);
    }
    if !(args.judge_latency_ms.is_finite() && args.judge_latency_ms >= 0.0) {
        eprintln!("reprise-sim: --judge-latency-ms must be 0 or more");
        return std::process::ExitCode::from(2);
    }
    if let Some(path) = &args.judge_labels {
        match JudgeLabels::read_file(path) {
            Ok(labels) => config.judge_labels = Some(labels),
            Err(err) => {
                eprintln!("reprise-sim: --judge-labels {err}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    config.judge_accuracy = args.judge_accuracy;
    config.judge_seed = args.judge_seed;
    config.judge_latency_ms = args.judge_latency_ms;
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(err) => {
            eprintln!("reprise-sim: cannot listen on {}: {err}", args.listen);
            return std::process::ExitCode::FAILURE;
        }
    };
    tracing::info!(listen = %args.listen, ?config, "reprise-sim listening");
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match sim::serve(listener, config, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("reprise-sim: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
