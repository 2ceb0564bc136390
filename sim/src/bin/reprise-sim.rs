//! `reprise-sim`: command line of the simulated OpenAI-compatible upstream (see `reprise_sim`).

use std::net::SocketAddr;

use clap::Parser;
use reprise_sim::{self as sim, Fault, Profile, SimConfig};

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
    /// Fault for every request: status=CODE, hang, cut[=N], abort[=N], malformed[=N], error-event[=N],
    /// bad-tool-args, redirect, content-filter, error-frame[=N], bad-utf8[=N], stall-at-done (close-early and
    /// garbage-status are per request only, as the `x-sim-fault` header).
    #[arg(long)]
    fault: Option<Fault>,
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
