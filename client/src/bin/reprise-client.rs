//! `reprise-client`: command line over the client library (benchmark driver for now).

use clap::{Parser, Subcommand};
use reprise_client::bench;

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
    /// Measure TTFT, inter-token gaps and total time by cache outcome against an OpenAI-compatible
    /// base URL (optionally two, side by side); closed or open loop, generated or file workloads.
    Bench(bench::cli::BenchArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::cli::main(args).await,
    }
}
