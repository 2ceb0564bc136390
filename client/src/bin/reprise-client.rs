//! `reprise-client`: command line over the client library: the benchmark driver, the match-quality
//! evaluation and the admin subcommands (their arguments, calls and tables live in the library).

use clap::{Parser, Subcommand};
use reprise_client::admin_cli::{self, AdminCommand};
use reprise_client::bench;

#[derive(Debug, Parser)]
#[command(
    name = "reprise-client",
    version,
    about = "Reprise client: benchmarks, match-quality evaluation and admin"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure TTFT, inter-token gaps and total time by cache outcome against an OpenAI-compatible
    /// base URL (optionally two, side by side); closed or open loop, generated or file workloads.
    Bench(Box<bench::cli::BenchArgs>),
    #[command(flatten)]
    Admin(AdminCommand),
    /// Match quality through a running gateway: store `a`, look up `b` for each labeled pair.
    Eval(reprise_client::eval::cli::EvalArgs),
    /// The threshold an application can afford: run its labeled pairs like `eval`, print the curve
    /// and the threshold within --max-wrong; --apply sets it live (for --namespace, or globally).
    Calibrate(reprise_client::eval::calibrate::CalibrateArgs),
    /// A delaying TCP proxy (test and benchmark tooling): every chunk either way arrives
    /// --delay-ms late, as over a slow link to a store.
    DelayProxy(reprise_client::delay::DelayProxyArgs),
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
        Command::Calibrate(args) => reprise_client::eval::calibrate::run(args).await,
        Command::Bench(args) => bench::cli::main(*args).await,
        Command::DelayProxy(args) => reprise_client::delay::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The subcommands share one parser: clap's own checks catch clashing flags.
    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// `--help` explains every option of every subcommand: an option listed bare leaves the
    /// operator guessing what it filters or changes.
    #[test]
    fn every_option_has_help() {
        fn bare(command: &clap::Command, path: &str, out: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    out.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    out.push(format!("{path} {} (the command itself)", sub.get_name()));
                }
                bare(sub, &path, out);
            }
        }
        let mut missing = Vec::new();
        bare(&super::Cli::command(), "", &mut missing);
        assert!(missing.is_empty(), "options without help: {missing:#?}");
    }
}
