//! The `reprise` binary: parses the command line, sets up logging, and runs the gateway library.
//! It must stay thin; behaviour belongs in the library where tests can reach it.

use reprise_server::config::{as_toml, Cli, Command, Config, ConfigCommand, LogFormat};
use tracing_subscriber::EnvFilter;

// jemalloc, not glibc's malloc: long streams free many small buffers from several threads, and
// glibc kept that memory (its per-thread arenas only shrink from the top), so the resident set grew
// with every long stream and never came down. jemalloc's background threads return freed pages to
// the system within seconds (measured: benches/stream-memory.sh, README "Memory").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_or_exit();
    let (args, check_only) = match cli.command {
        Command::Serve(args) => (args, false),
        Command::CheckConfig(args) => (args, true),
        Command::Config(ConfigCommand::Example) => {
            print!("{}", as_toml::example());
            return std::process::ExitCode::SUCCESS;
        }
    };
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(err) => {
            eprintln!("reprise: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    if check_only {
        print!("{}", as_toml::effective(&config));
        return std::process::ExitCode::SUCCESS;
    }
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("reprise: cannot start the runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(serve(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            eprintln!("reprise: {err}");
            std::process::ExitCode::FAILURE
        }
    };
    // Dropping a runtime waits for every blocking task; one stuck on a failing disk must not keep
    // the process (and the store's lock) alive: `run` has already waited its grace period.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    code
}

async fn serve(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let state = reprise_server::AppState::new(config.clone())?;
    tracing::info!(
        listen = %listener.local_addr()?,
        upstream = %config.upstream_url,
        anthropic_upstream = %config.anthropic_upstream_url,
        admin = config.admin_token.is_some(),
        "reprise gateway listening"
    );
    reprise_server::run(listener, state, reprise_server::shutdown_signal()).await?;
    tracing::info!("reprise stopped");
    Ok(())
}

fn init_logging(format: LogFormat) {
    // RUST_LOG wins; otherwise info for our crates and warnings for dependencies.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,reprise=info,reprise_server=info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
