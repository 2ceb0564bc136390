//! `reprise-client bench`: its flags, and turning them into a run, a progress bar and the outputs
//! (terminal table, `--json`, `--report DIR`). The binary only parses and dispatches here.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::openloop::{self, Arrivals};
use super::workload::{self, Bank, GenSpec, Generator, Order, Workload};
use super::{base_url, paraphrase, report, Api, BenchConfig, Event, Progress};

/// Measure TTFT, inter-token gaps and total time against an OpenAI-compatible (or, with `--api
/// anthropic`, a Messages API) base URL, by cache outcome (optionally against a second URL side by
/// side).
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").args(["unique_prompts", "prompts_file", "workload", "generate", "pairs"])))]
pub struct BenchArgs {
    /// Base URL: the gateway root (`/v1` is appended to a URL without a path), or a full base URL
    /// such as reprise-sim's or any OpenAI-compatible server's `.../v1`.
    #[arg(long, env = "REPRISE_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// A second base URL measured in the same run with the same requests (e.g. the direct upstream).
    #[arg(long)]
    pub compare: Option<String>,
    /// Another base URL of the same service (e.g. a second gateway replica), repeatable: requests
    /// go to --url and these in turn and are reported as one target (--compare stays a second one).
    #[arg(long, value_name = "URL")]
    pub round_robin: Vec<String>,
    /// API the requests speak: `openai` (chat completions) or `anthropic` (the Messages API,
    /// `POST {url}/messages` with `x-api-key` and `anthropic-version: 2023-06-01`, tokens counted
    /// per `content_block_delta`). The gateway serves both, so either can be measured.
    #[arg(long, value_enum, default_value_t = Api::Openai)]
    pub api: Api,
    /// API key sent as the bearer token (`--api openai`) or as `x-api-key` (`--api anthropic`); `""`
    /// sends none (the gateway's anonymous tenant, where entries warmed with `"api_key": ""` live).
    #[arg(
        long,
        env = "OPENAI_API_KEY",
        default_value = "sk-reprise-bench",
        hide_env_values = true
    )]
    pub api_key: String,
    /// Model of every request that does not name its own.
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Measured requests per target [default: 200, or unbounded with --duration].
    #[arg(long)]
    pub requests: Option<usize>,
    /// Stop starting requests after this many seconds [default: 300].
    #[arg(long, alias = "max-seconds", value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Closed loop: concurrent workers, each sending its next request when the last one answered.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Open loop: arrivals per second on a fixed schedule, not waiting for answers.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Open loop: arrivals evenly spaced, or a Poisson process at the same mean rate (seeded by
    /// --seed).
    #[arg(long, value_enum, default_value_t = Arrivals::Uniform, requires = "rate")]
    pub arrivals: Arrivals,
    /// Open loop: most requests in flight; an arrival beyond it is dropped (and counted).
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// Warm-up requests per target, not measured.
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Send non-streaming requests.
    #[arg(long)]
    pub no_stream: bool,
    /// Cycle over this many distinct generated prompts, so that repeats can be served from a cache.
    #[arg(long)]
    pub unique_prompts: Option<usize>,
    /// Send these prompts, one per line, in order (cycled).
    #[arg(long)]
    pub prompts_file: Option<PathBuf>,
    /// A JSON Lines workload: `{"prompt": ...}` or `{"messages": [...]}` per line, with optional
    /// `group` (paraphrases share one), `weight` and `model`.
    #[arg(long, value_name = "FILE")]
    pub workload: Option<PathBuf>,
    /// Order of the --workload lines [default: weighted if any line has a weight, else sequential].
    #[arg(long, value_enum)]
    pub order: Option<Order>,
    /// Generate the workload: Zipf-distributed repeats and paraphrases from a bank of paraphrase groups.
    #[arg(long)]
    pub generate: bool,
    /// Generated: distinct prompts; with --repeat-share only a cap [default: 200 without --repeat-share].
    #[arg(long, requires = "generate")]
    pub distinct: Option<usize>,
    /// Generated: Zipf exponent of the repeat distribution (higher: repeats concentrate on fewer prompts).
    #[arg(long, default_value_t = 1.0, requires = "generate")]
    pub zipf_s: f64,
    /// Generated: share of requests repeating an earlier prompt verbatim (fixes the shares instead of
    /// drawing every request from the Zipf law).
    #[arg(long, requires = "generate")]
    pub repeat_share: Option<f64>,
    /// Generated: share of requests that paraphrase an earlier prompt.
    #[arg(long, default_value_t = 0.2, requires = "generate")]
    pub paraphrase_share: f64,
    /// Generated: bank of paraphrase groups (JSON Lines with `prompt` and `group`) [default: built in,
    /// benches/workloads/bank.jsonl].
    #[arg(long, requires = "generate")]
    pub bank: Option<PathBuf>,
    /// The paraphrase workload: labeled pairs (JSON Lines with `a`, `b`, `same_answer`, the eval's
    /// format). Stores every `a`, then asks every `b` (with `Cache-Control: no-store`) in --rounds
    /// rounds and reports per round the should-hit and trap `b` served, judge calls per lookup
    /// (from /admin/stats) and the TTFT of misses and verified hits. Closed loop only.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["rate", "requests", "duration", "round_robin"])]
    pub pairs: Option<PathBuf>,
    /// Paraphrase workload: times every `b` is asked.
    #[arg(long, default_value_t = 3, requires = "pairs")]
    pub rounds: usize,
    /// Paraphrase workload: slices of each round, with the judge's counters read after each.
    #[arg(long, default_value_t = 1, requires = "pairs")]
    pub segments: usize,
    /// Paraphrase workload: longest wait, in seconds, for a background judge queue to empty
    /// after a slice.
    #[arg(long, default_value_t = 120.0, requires = "pairs")]
    pub drain_timeout: f64,
    /// Admin token of the gateways, for /admin/stats (paraphrase workload).
    #[arg(long, env = "REPRISE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Seed of the generated workload and of weighted draws (runs with one seed send the same requests).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Sent as `x-reprise-namespace` so the run starts from a cache of its own; `none` to send no
    /// namespace [default: a fresh one per run].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write report.md, report.json and SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    pub report: Option<PathBuf>,
    /// Write every measured request as one JSON line (target, index, kind, outcome, TTFT, total,
    /// phases, error) to this file, so runs can be pooled or paired by a script.
    #[arg(long, value_name = "FILE")]
    pub samples: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    format!("{:x}", u64::from(std::process::id()) ^ nanos)
}

fn read_prompts(path: &PathBuf) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The workload the flags describe.
pub fn workload_of(args: &BenchArgs, run_id: &str) -> Result<Workload, String> {
    if let Some(n) = args.unique_prompts {
        return Ok(Workload::cycle(run_id, n));
    }
    if let Some(path) = &args.prompts_file {
        return Workload::prompts(&read_prompts(path)?)
            .map_err(|e| format!("{}: {e}", path.display()));
    }
    if let Some(path) = &args.workload {
        let items = workload::read_jsonl(path).map_err(|e| e.to_string())?;
        let order = args
            .order
            .unwrap_or(if items.iter().any(|i| i.weight != 1.0) {
                Order::Weighted
            } else {
                Order::Sequential
            });
        return Workload::list(items, order, args.seed);
    }
    if args.generate {
        let bank = match &args.bank {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                Bank::parse(&text, &path.display().to_string())
            }
            None => Bank::default_bank(),
        }
        .map_err(|e| e.to_string())?;
        let spec = GenSpec {
            distinct: args.distinct,
            zipf_s: args.zipf_s,
            repeat_share: args.repeat_share,
            paraphrase_share: args.paraphrase_share,
            seed: args.seed,
        };
        return Ok(Workload::generated(Generator::new(spec, Arc::new(bank))?));
    }
    Ok(Workload::fresh(run_id))
}

/// The run configuration the flags describe.
pub fn config_of(args: &BenchArgs, run_id: &str) -> Result<BenchConfig, String> {
    let mut targets = vec![base_url(&args.url)?];
    if let Some(second) = &args.compare {
        targets.push(base_url(second)?);
    }
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("--rate must be above 0, got {rate}"));
        }
    }
    let duration = args.duration.unwrap_or(300.0);
    if !(duration.is_finite() && duration > 0.0) {
        return Err(format!("--duration must be above 0, got {duration}"));
    }
    let requests = args.requests.unwrap_or(if args.duration.is_some() {
        usize::MAX
    } else {
        200
    });
    let namespace = match args.namespace.as_deref() {
        Some("none") => None,
        Some(n) => Some(n.to_owned()),
        None => Some(format!("bench-{run_id}")),
    };
    let round_robin = args
        .round_robin
        .iter()
        .map(|u| base_url(u))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BenchConfig {
        targets,
        round_robin,
        api: args.api,
        api_key: args.api_key.clone(),
        model: args.model.clone(),
        requests,
        concurrency: args.concurrency.max(1),
        rate: args.rate,
        arrivals: args.arrivals,
        seed: args.seed,
        max_in_flight: args.max_in_flight.max(1),
        stream: !args.no_stream,
        warmup: args.warmup,
        run_id: run_id.to_owned(),
        max_duration: Duration::from_secs_f64(duration),
        namespace,
    })
}

/// A bar over the measured requests (or a spinner when only time bounds the run) with the running
/// hit rate; hidden with `--quiet` and whenever stderr is not a terminal.
fn progress_bar(config: &BenchConfig, quiet: bool) -> ProgressBar {
    let per_arrival = config.targets.len() as u64;
    let length = match config.rate {
        // A Poisson run's count is only known once drawn: the bar shows the expected one.
        Some(rate) => Some(
            openloop::schedule(
                rate,
                config.requests,
                config.max_duration,
                config.arrivals,
                config.seed,
            )
            .expected_len() as u64,
        ),
        None => (config.requests != usize::MAX).then_some(config.requests as u64),
    };
    let target = if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = match length {
        Some(n) => {
            let bar = ProgressBar::with_draw_target(Some(n * per_arrival), target);
            if let Ok(style) =
                ProgressStyle::with_template("{elapsed_precise} [{bar:24}] {pos}/{len} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        }
        None => {
            let bar = ProgressBar::with_draw_target(None, target);
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {elapsed_precise} {pos} requests {msg}")
            {
                bar.set_style(style);
            }
            bar
        }
    };
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn progress_of(bar: ProgressBar) -> Progress {
    let served = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    Arc::new(move |event: Event<'_>| {
        match event {
            Event::Done(sample) => {
                done.fetch_add(1, Ordering::Relaxed);
                if sample.error.is_some() {
                    errors.fetch_add(1, Ordering::Relaxed);
                } else if matches!(
                    sample.outcome.as_str(),
                    "hit" | "semantic-hit" | "coalesced"
                ) {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
            Event::Dropped => {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        bar.inc(1);
        let n = done.load(Ordering::Relaxed);
        let dropped = match dropped.load(Ordering::Relaxed) {
            0 => String::new(),
            d => format!(", {d} dropped"),
        };
        bar.set_message(format!(
            "{:.1}/s, from cache {:.0}%, {} errors{dropped}",
            n as f64 / started.elapsed().as_secs_f64().max(1e-3),
            served.load(Ordering::Relaxed) as f64 * 100.0 / n.max(1) as f64,
            errors.load(Ordering::Relaxed)
        ));
    })
}

/// Writes `samples` as JSON Lines to `path` (`--samples`).
fn write_samples(path: &std::path::Path, samples: &[super::Sample]) -> Result<(), String> {
    let mut text = String::new();
    for sample in samples {
        let line = serde_json::to_string(sample).map_err(|e| e.to_string())?;
        text.push_str(&line);
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The paraphrase workload the flags describe, when `--pairs` names one.
pub fn paraphrase_of(args: &BenchArgs) -> Result<Option<paraphrase::Spec>, String> {
    let Some(path) = &args.pairs else {
        return Ok(None);
    };
    if args.rounds == 0 || args.segments == 0 {
        return Err("--rounds and --segments must be at least 1".into());
    }
    if !(args.drain_timeout.is_finite() && args.drain_timeout >= 0.0) {
        return Err(format!(
            "--drain-timeout must be 0 or more, got {}",
            args.drain_timeout
        ));
    }
    // Ambiguous pairs count as traps, as fow-cache and reprise-sim's judge read them.
    let pairs = crate::eval::pairs::read_file(path, crate::eval::pairs::Ambiguous::Different)
        .map_err(|e| e.to_string())?;
    Ok(Some(paraphrase::Spec {
        pairs,
        rounds: args.rounds,
        segments: args.segments,
        admin_token: args.admin_token.clone(),
        drain_timeout: Duration::from_secs_f64(args.drain_timeout),
    }))
}

/// Runs the paraphrase workload and writes its outputs.
async fn main_paraphrase(
    args: &BenchArgs,
    mut config: BenchConfig,
    spec: paraphrase::Spec,
) -> ExitCode {
    config.warmup = 0;
    let total = spec.pairs.len() * spec.rounds * config.targets.len();
    let bar = progress_bar(
        &BenchConfig {
            requests: total / config.targets.len().max(1),
            ..config.clone()
        },
        args.quiet,
    );
    let result = paraphrase::run(config, spec, progress_of(bar.clone())).await;
    bar.finish_and_clear();
    let report = match result {
        Ok(r) => r,
        Err(err) => {
            eprintln!("reprise-client bench: {err}");
            return ExitCode::FAILURE;
        }
    };
    let text = paraphrase::render(&report);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(err) => {
                eprintln!("reprise-client bench: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{text}");
    }
    if let Some(path) = &args.samples {
        let samples: Vec<super::Sample> = report.samples.iter().map(|a| a.sample.clone()).collect();
        if let Err(err) = write_samples(path, &samples) {
            eprintln!("reprise-client bench: {err}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(dir) = &args.report {
        let written = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(dir.join("report.md"), &text))
            .map_err(|e| e.to_string())
            .and_then(|_| serde_json::to_string_pretty(&report).map_err(|e| e.to_string()))
            .and_then(|json| {
                std::fs::write(dir.join("report.json"), json).map_err(|e| e.to_string())
            });
        if let Err(err) = written {
            eprintln!(
                "reprise-client bench: cannot write {}: {err}",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    }
    if report.overall.iter().any(|r| r.lookups == 0) {
        eprintln!("reprise-client bench: every lookup to a target failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Runs `reprise-client bench`.
pub async fn main(args: BenchArgs) -> ExitCode {
    let id = run_id();
    match config_of(&args, &id).and_then(|c| Ok((c, paraphrase_of(&args)?))) {
        Ok((config, Some(spec))) => return main_paraphrase(&args, config, spec).await,
        Ok((_, None)) => {}
        Err(err) => {
            eprintln!("reprise-client bench: {err}");
            return ExitCode::from(2);
        }
    }
    let (config, workload) =
        match config_of(&args, &id).and_then(|c| Ok((c, workload_of(&args, &id)?))) {
            Ok(v) => v,
            Err(err) => {
                eprintln!("reprise-client bench: {err}");
                return ExitCode::from(2);
            }
        };
    let bar = progress_bar(&config, args.quiet);
    let report = super::run(config, workload, progress_of(bar.clone())).await;
    bar.finish_and_clear();
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("reprise-client bench: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", super::render(&report));
    }
    if let Some(path) = &args.samples {
        if let Err(err) = write_samples(path, &report.samples) {
            eprintln!("reprise-client bench: {err}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(dir) = &args.report {
        match report::write(dir, &report) {
            Ok(_) => eprintln!(
                "reprise-client bench: wrote {}",
                dir.join("report.md").display()
            ),
            Err(err) => {
                eprintln!("reprise-client bench: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    if report
        .targets
        .iter()
        .any(|t| t.errors == t.requests && t.requests > 0)
    {
        eprintln!("reprise-client bench: every request to a target failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    #[test]
    fn flags_make_a_config() {
        let args = parse(&[
            "--url",
            "http://127.0.0.1:8080",
            "--duration",
            "5",
            "--rate",
            "20",
        ])
        .expect("parses");
        let config = config_of(&args, "r1").expect("config");
        assert_eq!(config.targets, vec!["http://127.0.0.1:8080/v1".to_owned()]);
        assert_eq!(config.requests, usize::MAX);
        assert_eq!(config.rate, Some(20.0));
        assert_eq!(config.namespace.as_deref(), Some("bench-r1"));
        let args = parse(&[
            "--max-seconds",
            "5",
            "--requests",
            "10",
            "--namespace",
            "none",
        ])
        .expect("alias");
        let config = config_of(&args, "r1").expect("config");
        assert_eq!((config.requests, config.namespace), (10, None));
        assert_eq!(config.max_duration, Duration::from_secs(5));
        assert!(config_of(&parse(&["--rate", "0"]).expect("parses"), "r").is_err());
        let poisson =
            parse(&["--rate", "5", "--arrivals", "poisson", "--seed", "9"]).expect("parses");
        let config = config_of(&poisson, "r").expect("config");
        assert_eq!((config.arrivals, config.seed), (Arrivals::Poisson, 9));
        assert_eq!(
            config_of(&args, "r").expect("config").arrivals,
            Arrivals::Uniform
        );
        assert!(parse(&["--arrivals", "poisson"]).is_err(), "needs --rate");
        assert_eq!(config.api, Api::Openai, "OpenAI unless asked");
        let anthropic = parse(&["--api", "anthropic"]).expect("parses");
        assert_eq!(
            config_of(&anthropic, "r").expect("config").api,
            Api::Anthropic
        );
        assert!(parse(&["--api", "gemini"]).is_err());
    }

    #[test]
    fn round_robin_spreads_the_first_target_over_its_urls() {
        let args = parse(&[
            "--url",
            "http://127.0.0.1:8081",
            "--round-robin",
            "http://127.0.0.1:8082",
            "--round-robin",
            "http://127.0.0.1:8083/v1",
        ])
        .expect("parses");
        let config = config_of(&args, "r").expect("config");
        let urls: Vec<&str> = (0..4).map(|i| config.url_of(0, i)).collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:8081/v1",
                "http://127.0.0.1:8082/v1",
                "http://127.0.0.1:8083/v1",
                "http://127.0.0.1:8081/v1"
            ]
        );
        let both = parse(&["--round-robin", "http://a", "--compare", "http://b"]).expect("parses");
        let config = config_of(&both, "r").expect("config");
        assert_eq!(
            config.url_of(1, 1),
            "http://b/v1",
            "the compared URL is not spread"
        );
        let plain = config_of(&parse(&[]).expect("parses"), "r").expect("config");
        assert_eq!(plain.url_of(0, 1), plain.url_of(0, 0));
    }

    #[test]
    fn samples_are_written_one_json_line_each() {
        let args = parse(&["--samples", "s.jsonl"]).expect("parses");
        assert_eq!(args.samples, Some(PathBuf::from("s.jsonl")));
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let mut first = super::super::Sample::new(0, 0, workload::Kind::New);
        first.outcome = "miss".to_owned();
        first.ttft_ms = Some(51.5);
        let second = super::super::Sample::new(1, 0, workload::Kind::New);
        write_samples(&path, &[first, second]).expect("written");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["outcome"], "miss");
        assert_eq!(lines[0]["ttft_ms"], 51.5);
        assert_eq!(
            (lines[1]["target"].as_u64(), lines[1]["index"].as_u64()),
            (Some(1), Some(0))
        );
    }

    #[test]
    fn workload_flags_conflict_and_depend() {
        assert!(parse(&["--generate", "--unique-prompts", "3"]).is_err());
        assert!(
            parse(&["--zipf-s", "1.2"]).is_err(),
            "--zipf-s needs --generate"
        );
        assert!(parse(&["--rate", "5", "--concurrency", "2"]).is_err());
        let args = parse(&[
            "--generate",
            "--repeat-share",
            "0.3",
            "--paraphrase-share",
            "0.2",
        ])
        .expect("parses");
        let mut w = workload_of(&args, "r").expect("workload");
        assert!(
            w.describe().contains("30% repeats, 20% paraphrases"),
            "{}",
            w.describe()
        );
        w.next_planned();
        let args = parse(&[
            "--generate",
            "--repeat-share",
            "0.9",
            "--paraphrase-share",
            "0.2",
        ])
        .expect("parses");
        assert!(workload_of(&args, "r")
            .expect_err("above 1")
            .contains("above 1"));
    }

    #[test]
    fn pairs_make_a_paraphrase_workload() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pairs.jsonl");
        std::fs::write(
            &path,
            "{\"a\": \"x\", \"b\": \"y\", \"same_answer\": true}\n{\"a\": \"x\", \"b\": \"z\", \"same_answer\": false, \"ambiguous\": \"scope\"}\n",
        )
        .expect("write");
        let file = path.to_str().expect("utf-8 path");
        let args = parse(&["--pairs", file, "--rounds", "4", "--segments", "2"]).expect("parses");
        let spec = paraphrase_of(&args)
            .expect("reads")
            .expect("a paraphrase workload");
        assert_eq!((spec.rounds, spec.segments, spec.pairs.len()), (4, 2, 2));
        assert!(!spec.pairs[1].same_answer, "an ambiguous pair is a trap");
        assert_eq!(spec.drain_timeout, Duration::from_secs(120));
        assert!(paraphrase_of(&parse(&[]).expect("parses"))
            .expect("ok")
            .is_none());
        let zero = parse(&["--pairs", file, "--rounds", "0"]).expect("parses");
        assert!(paraphrase_of(&zero).is_err());
        assert!(parse(&["--rounds", "2"]).is_err(), "--rounds needs --pairs");
        assert!(
            parse(&["--pairs", file, "--rate", "5"]).is_err(),
            "closed loop only"
        );
        assert!(
            parse(&["--pairs", file, "--generate"]).is_err(),
            "one source"
        );
        let missing = parse(&["--pairs", "/nonexistent/pairs.jsonl"]).expect("parses");
        assert!(paraphrase_of(&missing)
            .expect_err("no file")
            .contains("cannot read"));
    }
}
