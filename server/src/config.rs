//! Gateway configuration: defaults, then a TOML file, then `REPRISE_*` environment variables, then CLI flags.
//!
//! Everything that can be set is parsed into its type where it is read (a cache mode is a
//! [`CacheMode`], not a string) and checked once, at start-up, with a message naming the key;
//! nothing downstream parses or re-checks it. The settings an operator may change while serving
//! are one [`LiveSettings`], flattened in so that the file keeps flat keys. Secrets are wrapped so
//! that `Debug` and logs never print them.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::error::{ContextKind, ErrorKind};
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::guard::Guards;
use crate::live::LiveSettings;
use crate::policy::{CacheMode, Pacing};

pub mod as_toml;

/// A value that must never reach a log line: `Debug` and `Display` print `*****`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must send or compare it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("*****")
    }
}

/// Written out (by `check-config`) as `*****` too: the written file must not hold it either.
impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(as_toml::REDACTED)
    }
}

/// Where cache entries live: sled in `data_dir` (one process), or a Redis server that several
/// replicas share (`redis_url`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Sled,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The `reprise` command line.
#[derive(Debug, Parser)]
#[command(
    name = "reprise",
    version,
    about = "Reprise: an OpenAI-compatible semantic prompt cache"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the command line, or prints why not and exits as clap does (status 2). clap names
    /// the flag of a bad value even when the value came from the flag's environment variable;
    /// then the variable is named instead, since that is where the operator must look.
    pub fn parse_or_exit() -> Self {
        let err = match Self::try_parse() {
            Ok(cli) => return cli,
            Err(err) => err,
        };
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let Some(variable) = from_environment(&err, &args) else {
            err.exit()
        };
        let value = err.get(ContextKind::InvalidValue).map(|v| v.to_string());
        // A value parser's own reason, or the choices of an enumerated flag.
        let why = std::error::Error::source(&err)
            .map(|e| e.to_string())
            .or_else(|| {
                let valid = err.get(ContextKind::ValidValue)?;
                Some(format!("expected one of {valid}"))
            })
            .unwrap_or_else(|| err.kind().to_string());
        eprintln!(
            "reprise: invalid value `{}` in the environment variable {variable}: {why}",
            value.unwrap_or_default()
        );
        std::process::exit(2)
    }
}

/// The environment variable that gave the value `err` refuses: the flag's own variable, when it
/// is set and the flag is absent from `args`.
fn from_environment(err: &clap::Error, args: &[String]) -> Option<String> {
    if err.kind() != ErrorKind::ValueValidation && err.kind() != ErrorKind::InvalidValue {
        return None;
    }
    // Rendered as `--replay <REPLAY>`.
    let shown = err.get(ContextKind::InvalidArg)?.to_string();
    let long = shown.strip_prefix("--")?.split(' ').next()?.to_owned();
    let flag = format!("--{long}");
    let given = args
        .iter()
        .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
    let command = Cli::command();
    let variable = std::iter::once(&command)
        .chain(command.get_subcommands())
        .flat_map(|c| c.get_arguments())
        .find(|a| a.get_long() == Some(long.as_str()))?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    (!given && std::env::var_os(&variable).is_some()).then_some(variable)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway.
    Serve(ServeArgs),
    /// Print the effective configuration as a commented TOML file (`--config` reads it back;
    /// secrets are left out) and exit.
    CheckConfig(ServeArgs),
    /// The configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
}

/// `reprise config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print a commented TOML file of every key with its default (`check-config` prints the
    /// effective values in the same form).
    Example,
}

/// Flags of `reprise serve`. Each is optional here so that a flag left unset falls back to the
/// environment (clap's `env`), then to the TOML file, then to the default.
#[derive(Debug, Args, Default, Clone)]
pub struct ServeArgs {
    /// TOML configuration file; its keys are the flag names with `_` for `-`.
    #[arg(long, env = "REPRISE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, env = "REPRISE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Upstream base URL including `/v1` [default: https://api.openai.com/v1].
    #[arg(long, env = "REPRISE_UPSTREAM_URL")]
    pub upstream_url: Option<String>,
    /// Anthropic upstream base URL including `/v1`, for `/v1/messages` and the paths below it
    /// [default: https://api.anthropic.com/v1].
    #[arg(long, env = "REPRISE_ANTHROPIC_UPSTREAM_URL")]
    pub anthropic_upstream_url: Option<String>,
    /// API key sent to `upstream_url` instead of the client's credential headers (`Authorization`,
    /// and `api-key` or `x-api-key` when the client sent them); never sent to the Anthropic upstream.
    #[arg(long, env = "REPRISE_UPSTREAM_API_KEY", hide_env_values = true)]
    pub upstream_api_key: Option<String>,
    /// API key sent to `anthropic_upstream_url` as `x-api-key` instead of the client's credential
    /// headers; never sent to the OpenAI upstream.
    #[arg(long, env = "REPRISE_ANTHROPIC_API_KEY", hide_env_values = true)]
    pub anthropic_api_key: Option<String>,
    /// Folder for the cache store [default: ./reprise-data].
    #[arg(long, env = "REPRISE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Refuse to start on a corrupt store instead of moving it aside and starting empty [default: false].
    #[arg(long, env = "REPRISE_STRICT_STORE", num_args = 0..=1, default_missing_value = "true")]
    pub strict_store: Option<bool>,
    /// Where cache entries live: sled in the data dir, or a shared Redis [default: sled].
    #[arg(long, env = "REPRISE_STORE", value_enum)]
    pub store: Option<StoreKind>,
    /// Redis for `--store redis`: one server, redis://[user:password@]host:port[/db] or rediss://
    /// (TLS); a Redis Cluster, redis+cluster://[user:password@]host:port[,host:port...] (seed nodes)
    /// or rediss+cluster://; or behind Sentinels,
    /// redis+sentinel://[user:password@]host:port[,host:port...]/<master-name>[/<db>] or
    /// rediss+sentinel:// (the credentials are the master's).
    #[arg(long, env = "REPRISE_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// This replica's name in the change feed and `/admin/stats` [default: host-pid-random].
    #[arg(long, env = "REPRISE_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Bearer token for `/admin/*`; without one the admin routes are disabled.
    #[arg(long, env = "REPRISE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Log format [default: text].
    #[arg(long, env = "REPRISE_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// Largest accepted JSON request body in bytes [default: 33554432 = 32 MiB, Anthropic's own
    /// request limit].
    #[arg(long, env = "REPRISE_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Upstream TCP/TLS connect timeout in ms [default: 10000].
    #[arg(long, env = "REPRISE_CONNECT_TIMEOUT_MS")]
    pub connect_timeout_ms: Option<u64>,
    /// Longest wait for the upstream's response head and first event, in ms [default: 600000].
    #[arg(long, env = "REPRISE_FIRST_BYTE_TIMEOUT_MS")]
    pub first_byte_timeout_ms: Option<u64>,
    /// Longest silence between two upstream chunks, in ms [default: 120000].
    #[arg(long, env = "REPRISE_IDLE_TIMEOUT_MS")]
    pub idle_timeout_ms: Option<u64>,
    /// How long in-flight requests may run after SIGINT/SIGTERM, in ms [default: 10000].
    #[arg(long, env = "REPRISE_SHUTDOWN_GRACE_MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// Longest wait for a client's complete request head, from its first byte (or from accepting a
    /// new connection), in ms; then the connection is closed [default: 10000].
    #[arg(long, env = "REPRISE_CLIENT_HEADER_TIMEOUT_MS")]
    pub client_header_timeout_ms: Option<u64>,
    /// Longest silence between two pieces of a client's request body, in ms; then 408 [default: 30000].
    #[arg(long, env = "REPRISE_CLIENT_BODY_TIMEOUT_MS")]
    pub client_body_timeout_ms: Option<u64>,
    /// Longest a write to a client may make no progress (the client stopped reading), in ms; then
    /// the connection is closed, and a streaming miss's upstream with it [default: 30000].
    #[arg(long, env = "REPRISE_CLIENT_SEND_TIMEOUT_MS")]
    pub client_send_timeout_ms: Option<u64>,
    /// How long an idle keep-alive client connection stays open, in ms [default: 75000].
    #[arg(long, env = "REPRISE_KEEPALIVE_TIMEOUT_MS")]
    pub keepalive_timeout_ms: Option<u64>,
    /// Most client connections served at once; beyond it new ones wait and idle ones are closed
    /// [default: (open-file limit - 128) / 2].
    #[arg(long, env = "REPRISE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// How many recent requests `/admin/requests` keeps [default: 1000].
    #[arg(long, env = "REPRISE_REQUEST_LOG_SIZE")]
    pub request_log_size: Option<usize>,
    /// Default time to live of a cache entry, in seconds [default: 604800 = 7 days].
    #[arg(long, env = "REPRISE_DEFAULT_TTL_S")]
    pub default_ttl_s: Option<u64>,
    /// Share entries across API keys (one tenant) instead of partitioning by key [default: false].
    #[arg(long, env = "REPRISE_SHARE_ACROSS_KEYS")]
    pub share_across_keys: Option<bool>,
    /// Default cache mode: on, off, read-only, write-only, exact-only, shadow [default: on].
    #[arg(long, env = "REPRISE_CACHE_MODE")]
    pub cache_mode: Option<CacheMode>,
    /// Default replay pacing of hits: instant, recorded, tokens-per-second=N [default: instant].
    #[arg(long, env = "REPRISE_REPLAY")]
    pub replay: Option<Pacing>,
    /// Most entries kept; the least recently used go first [default: 100000].
    #[arg(long, env = "REPRISE_MAX_ENTRIES")]
    pub max_entries: Option<usize>,
    /// Most bytes of entries kept [default: 1073741824 = 1 GiB].
    #[arg(long, env = "REPRISE_MAX_BYTES")]
    pub max_bytes: Option<u64>,
    /// Largest answer recorded for the cache, in bytes; a larger one is relayed but not stored
    /// [default: 8388608 = 8 MiB].
    #[arg(long, env = "REPRISE_MAX_ENTRY_BYTES")]
    pub max_entry_bytes: Option<usize>,
    /// Also store answers cut at max_tokens (`finish_reason: "length"`) [default: false].
    #[arg(long, env = "REPRISE_CACHE_LENGTH_FINISH")]
    pub cache_length_finish: Option<bool>,
    /// When a client disconnects mid-stream, keep reading the upstream to cache the answer [default: true].
    #[arg(long, env = "REPRISE_COMPLETE_ON_DISCONNECT")]
    pub complete_on_disconnect: Option<bool>,
    /// How long a stream may be read after its client left, in ms [default: 60000].
    #[arg(long, env = "REPRISE_DISCONNECT_BUDGET_MS")]
    pub disconnect_budget_ms: Option<u64>,
    /// Folder of the embedding model (ONNX + tokenizer + reprise-model.toml) [default: models/all-MiniLM-L6-v2].
    #[arg(long, env = "REPRISE_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,
    /// ONNX Runtime shared library [default: models/onnxruntime/libonnxruntime.so].
    #[arg(long, env = "REPRISE_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// Semantic matching on or off [default: true].
    #[arg(long, env = "REPRISE_SEMANTIC")]
    pub semantic: Option<bool>,
    /// Lowest similarity (0..1) a semantic hit needs; clients may only raise it [default: 0.9].
    #[arg(long, env = "REPRISE_SIMILARITY_THRESHOLD")]
    pub similarity_threshold: Option<f32>,
    /// Embedding deadline in ms; a later embedding falls back to exact matching [default: 250].
    #[arg(long, env = "REPRISE_EMBED_DEADLINE_MS")]
    pub embed_deadline_ms: Option<u64>,
    /// ONNX Runtime threads per model call (the embed worker counts as one) [default: 1 for a model
    /// run one text at a time, as the provisioned one is; one per core for a model that batches].
    #[arg(long, env = "REPRISE_EMBED_THREADS")]
    pub embed_threads: Option<usize>,
    /// Longest expected wait, in ms, for a miss's vector (queued model calls ahead of it and its
    /// own, with batching); beyond it the miss skips semantic matching at once
    /// (`x-reprise-semantic: skipped; reason=overload`). 0: only while the model is idle [default: 100].
    #[arg(long, env = "REPRISE_EMBED_QUEUE_BUDGET_MS")]
    pub embed_queue_budget_ms: Option<u64>,
    /// Send a miss upstream without waiting for semantic matching: the embedding and search run while
    /// the upstream request is in flight, and a hit found before its first byte is served instead
    /// (the upstream request is then cancelled) [default: false].
    #[arg(long, env = "REPRISE_SEMANTIC_OVERLAP")]
    pub semantic_overlap: Option<bool>,
    /// Guards a semantic match must pass: a comma-separated list of numbers, negation, format,
    /// task, direction, antonym, entity, template, or `none` [default: all eight].
    #[arg(long, env = "REPRISE_SEMANTIC_GUARDS")]
    pub semantic_guards: Option<Guards>,
    /// Export OpenTelemetry traces over OTLP/HTTP to this collector (e.g. http://127.0.0.1:4318;
    /// `/v1/traces` is appended). The standard `OTEL_EXPORTER_OTLP_*` variables also turn it on
    /// [default: off].
    #[arg(long, env = "REPRISE_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Verify near matches with a judge model before serving them: off or judge [default: off].
    #[arg(long, env = "REPRISE_VERIFY", value_enum)]
    pub verify: Option<crate::verify::settings::VerifyKind>,
    /// sync: judge before answering; async: answer from upstream, judge in the background for the
    /// next request [default: sync].
    #[arg(long, env = "REPRISE_VERIFY_MODE", value_enum)]
    pub verify_mode: Option<crate::verify::settings::VerifyMode>,
    /// Lowest similarity (0..1) worth a judge call [default: 0.75].
    #[arg(long, env = "REPRISE_VERIFY_FLOOR")]
    pub verify_floor: Option<f32>,
    /// Error budget (0..1): the largest share of wrong answers among near matches served without a
    /// judge call; each namespace learns where that holds from its verdicts; `none`: candidates at
    /// or above the threshold are served unjudged [default: 0.01].
    #[arg(long, env = "REPRISE_MAX_WRONG")]
    pub max_wrong: Option<crate::verify::settings::Budget>,
    /// The model judge calls ask (required with --verify judge).
    #[arg(long, env = "REPRISE_JUDGE_MODEL")]
    pub judge_model: Option<String>,
    /// The judge's base URL including `/v1` [default: the upstream URL].
    #[arg(long, env = "REPRISE_JUDGE_URL")]
    pub judge_url: Option<String>,
    /// Bearer token of judge calls [default: --upstream-api-key when the judge is the upstream;
    /// else, in sync mode, the request's own credential].
    #[arg(long, env = "REPRISE_JUDGE_API_KEY", hide_env_values = true)]
    pub judge_api_key: Option<String>,
    /// Longest wait for a verdict in ms; then the candidate is not served [default: 2000].
    #[arg(long, env = "REPRISE_JUDGE_TIMEOUT_MS")]
    pub judge_timeout_ms: Option<u64>,
    /// Most judge calls in flight [default: 8].
    #[arg(long, env = "REPRISE_JUDGE_MAX_CONCURRENCY")]
    pub judge_max_concurrency: Option<usize>,
    /// Most judge calls per second, bursts of one second's worth; 0: no limit [default: 20].
    #[arg(long, env = "REPRISE_JUDGE_RATE")]
    pub judge_rate: Option<f64>,
    /// A file whose text replaces the judge's instruction (server/prompts/judge-v1.txt).
    #[arg(long, env = "REPRISE_JUDGE_PROMPT")]
    pub judge_prompt: Option<PathBuf>,
    /// A price table (TOML, the format of server/prices.toml) whose models extend or override the
    /// compiled-in defaults, for the money hits saved.
    #[arg(long, env = "REPRISE_PRICES")]
    pub prices: Option<PathBuf>,
}

/// The validated configuration the gateway runs with: the start-up settings, and the first
/// [`LiveSettings`].
// Serialized only to be written out as TOML (`config::as_toml`); secrets serialize as `*****`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: SocketAddr,
    pub upstream_url: String,
    /// Where Anthropic's Messages API (`/v1/messages` and below) goes: its own provider.
    pub anthropic_upstream_url: String,
    pub upstream_api_key: Option<Secret>,
    /// The key the gateway sends to the Anthropic upstream instead of the client's.
    pub anthropic_api_key: Option<Secret>,
    pub data_dir: PathBuf,
    /// Refuse to start on a corrupt store (else it is moved aside and the cache starts empty).
    pub strict_store: bool,
    /// Where cache entries live.
    pub store: StoreKind,
    /// The Redis server of `store = "redis"` (a secret: it may carry a password).
    pub redis_url: Option<Secret>,
    /// This replica's name among those sharing a Redis store (`None`: host, pid and a random suffix).
    pub replica_id: Option<String>,
    pub admin_token: Option<Secret>,
    pub log_format: LogFormat,
    pub max_body_bytes: usize,
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
    pub client_header_timeout_ms: u64,
    pub client_body_timeout_ms: u64,
    pub client_send_timeout_ms: u64,
    pub keepalive_timeout_ms: u64,
    /// `None`: derived from the open-file limit at start (see [`crate::serve::Limits`]).
    pub max_connections: Option<usize>,
    pub request_log_size: usize,
    pub share_across_keys: bool,
    pub max_entries: usize,
    pub max_bytes: u64,
    /// Largest answer the recorder buffers; past it the answer is relayed and not stored.
    pub max_entry_bytes: usize,
    pub cache_length_finish: bool,
    pub complete_on_disconnect: bool,
    pub disconnect_budget_ms: u64,
    /// How often expiry and the size caps are enforced, in ms (TOML only).
    pub sweep_interval_ms: u64,
    pub model_dir: PathBuf,
    pub ort_lib: PathBuf,
    pub semantic: bool,
    pub embed_deadline_ms: u64,
    /// ONNX Runtime intra-op threads; `None`: the model's default (`embed::default_threads`).
    pub embed_threads: Option<usize>,
    /// Longest expected wait for a miss's vector before it skips semantic matching.
    pub embed_queue_budget_ms: u64,
    /// Race semantic matching against the upstream request instead of waiting for it.
    pub semantic_overlap: bool,
    /// Most texts embedded together (TOML only).
    pub embed_max_batch: usize,
    /// Longest wait for a batch to fill, in ms (TOML only).
    pub embed_max_wait_ms: u64,
    /// How often the vector index is saved to the data dir, in seconds (TOML only).
    pub index_save_interval_s: u64,
    /// The live settings as configured at start-up, under their own flat keys in the file. While
    /// serving they may have changed: requests read [`crate::live::CurrentSettings`], never this copy.
    #[serde(flatten)]
    pub live: LiveSettings,
    /// OTLP/HTTP collector that traces are exported to; `None`: off unless `OTEL_EXPORTER_OTLP_*`.
    pub otlp_endpoint: Option<String>,
    /// Bearer token of judge calls.
    pub judge_api_key: Option<Secret>,
    pub judge_max_concurrency: usize,
    /// Judge calls per second; 0: no limit.
    pub judge_rate: f64,
    /// The judge's instruction, replacing the shipped one.
    pub judge_prompt: Option<PathBuf>,
    /// Most pairs waiting for a background verdict; more are dropped (TOML only).
    pub judge_queue: usize,
    /// A price table file over the compiled-in defaults (`server/prices.toml`).
    pub prices: Option<PathBuf>,
    // In the file: `[namespace_prices.support]` then `"gpt-4o" = { input = 2.0, output = 8.0 }`.
    /// Prices of a namespace's requests, model by model, over the table (TOML only).
    pub namespace_prices: crate::savings::NamespacePrices,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream_url: "https://api.openai.com/v1".to_owned(),
            anthropic_upstream_url: "https://api.anthropic.com/v1".to_owned(),
            upstream_api_key: None,
            anthropic_api_key: None,
            data_dir: PathBuf::from("./reprise-data"),
            strict_store: false,
            store: StoreKind::Sled,
            redis_url: None,
            replica_id: None,
            admin_token: None,
            log_format: LogFormat::Text,
            // Anthropic accepts requests up to 32 MB (PDFs and images in base64): a smaller cap
            // would refuse requests that work without the gateway. The body is held while it is
            // read and forwarded, not stored.
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_ms: 10_000,
            // Reasoning models can think for minutes before their first token; the official SDKs
            // wait 600 s by default, so the gateway must not give up sooner than they would.
            first_byte_timeout_ms: 600_000,
            idle_timeout_ms: 120_000,
            shutdown_grace_ms: 10_000,
            // nginx's and envoy's habits: a head takes milliseconds, so 10 s is generous; a body may
            // pause; a keep-alive connection outlives the SDKs' own pool expiry (4-5 s) by far.
            client_header_timeout_ms: 10_000,
            client_body_timeout_ms: 30_000,
            // nginx's send_timeout is 60 s; a reader that takes nothing for 30 s has gone.
            client_send_timeout_ms: 30_000,
            keepalive_timeout_ms: 75_000,
            max_connections: None,
            request_log_size: 1000,
            share_across_keys: false,
            max_entries: 100_000,
            max_bytes: 1 << 30,
            // A 100,000-token chat stream records about 20 MiB; the longest answers worth replaying
            // are far shorter, and 8 MiB bounds what each flight holds.
            max_entry_bytes: 8 * 1024 * 1024,
            cache_length_finish: false,
            complete_on_disconnect: true,
            disconnect_budget_ms: 60_000,
            sweep_interval_ms: 1000,
            model_dir: PathBuf::from("models/all-MiniLM-L6-v2"),
            ort_lib: PathBuf::from("models/onnxruntime/libonnxruntime.so"),
            semantic: true,
            embed_deadline_ms: 250,
            embed_threads: None,
            embed_queue_budget_ms: crate::embed::DEFAULT_QUEUE_BUDGET_MS,
            semantic_overlap: false,
            embed_max_batch: 16,
            embed_max_wait_ms: 2,
            index_save_interval_s: 300,
            live: LiveSettings::default(),
            otlp_endpoint: None,
            judge_api_key: None,
            judge_max_concurrency: 8,
            judge_rate: 20.0,
            judge_prompt: None,
            judge_queue: 1024,
            prices: None,
            namespace_prices: crate::savings::NamespacePrices::new(),
        }
    }
}

/// Settings of the cache that do not change per request.
#[derive(Debug, Clone)]
pub struct CacheSettings {
    pub share_across_keys: bool,
    /// Store answers that stopped at `max_tokens` (`finish_reason: "length"`).
    pub cache_length_finish: bool,
    /// Keep reading a stream whose client went away, so the answer can still be cached.
    pub complete_on_disconnect: bool,
    pub disconnect_budget_ms: u64,
    pub max_entries: usize,
    pub max_bytes: u64,
    /// Largest answer recorded; a larger one is relayed and not stored.
    pub max_entry_bytes: usize,
    pub sweep_interval_ms: u64,
}

pub use crate::error::ConfigError;

impl Config {
    /// Layers the sources in order (defaults, file, environment and flags) and validates the result.
    pub fn load(args: &ServeArgs) -> Result<Self, ConfigError> {
        let mut config = match &args.config {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        config.apply(args);
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let parse_error = |source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        };
        // Flattened fields are read from a buffer that has lost their place in the file: read the
        // live keys on their own first, so that a bad one is reported at its line.
        toml::from_str::<LiveSettings>(&text).map_err(parse_error)?;
        toml::from_str(&text).map_err(parse_error)
    }

    /// Overrides every field that the flags or the environment set.
    fn apply(&mut self, args: &ServeArgs) {
        // Destructured so that a new flag cannot be forgotten here.
        let ServeArgs {
            config: _,
            listen,
            upstream_url,
            anthropic_upstream_url,
            upstream_api_key,
            anthropic_api_key,
            data_dir,
            strict_store,
            store,
            redis_url,
            replica_id,
            admin_token,
            log_format,
            max_body_bytes,
            connect_timeout_ms,
            first_byte_timeout_ms,
            idle_timeout_ms,
            shutdown_grace_ms,
            client_header_timeout_ms,
            client_body_timeout_ms,
            client_send_timeout_ms,
            keepalive_timeout_ms,
            max_connections,
            request_log_size,
            default_ttl_s,
            share_across_keys,
            cache_mode,
            replay,
            max_entries,
            max_bytes,
            max_entry_bytes,
            cache_length_finish,
            complete_on_disconnect,
            disconnect_budget_ms,
            model_dir,
            ort_lib,
            semantic,
            similarity_threshold,
            embed_deadline_ms,
            embed_threads,
            embed_queue_budget_ms,
            semantic_overlap,
            semantic_guards,
            otlp_endpoint,
            verify,
            verify_mode,
            verify_floor,
            max_wrong,
            judge_model,
            judge_url,
            judge_api_key,
            judge_timeout_ms,
            judge_max_concurrency,
            judge_rate,
            judge_prompt,
            prices,
        } = args.clone();
        set(&mut self.listen, listen);
        set(&mut self.upstream_url, upstream_url);
        set(&mut self.anthropic_upstream_url, anthropic_upstream_url);
        if let Some(key) = upstream_api_key {
            self.upstream_api_key = Some(Secret::new(key));
        }
        if let Some(key) = anthropic_api_key {
            self.anthropic_api_key = Some(Secret::new(key));
        }
        set(&mut self.data_dir, data_dir);
        set(&mut self.strict_store, strict_store);
        set(&mut self.store, store);
        if let Some(url) = redis_url {
            self.redis_url = Some(Secret::new(url));
        }
        if let Some(id) = replica_id {
            self.replica_id = Some(id.clone());
        }
        if let Some(token) = admin_token {
            self.admin_token = Some(Secret::new(token));
        }
        set(&mut self.log_format, log_format);
        set(&mut self.max_body_bytes, max_body_bytes);
        set(&mut self.connect_timeout_ms, connect_timeout_ms);
        set(&mut self.first_byte_timeout_ms, first_byte_timeout_ms);
        set(&mut self.idle_timeout_ms, idle_timeout_ms);
        set(&mut self.shutdown_grace_ms, shutdown_grace_ms);
        set(&mut self.client_header_timeout_ms, client_header_timeout_ms);
        set(&mut self.client_body_timeout_ms, client_body_timeout_ms);
        set(&mut self.client_send_timeout_ms, client_send_timeout_ms);
        set(&mut self.keepalive_timeout_ms, keepalive_timeout_ms);
        if max_connections.is_some() {
            self.max_connections = max_connections;
        }
        set(&mut self.request_log_size, request_log_size);
        set(&mut self.live.default_ttl_s, default_ttl_s);
        set(&mut self.share_across_keys, share_across_keys);
        set(&mut self.live.cache_mode, cache_mode);
        set(&mut self.live.replay, replay);
        set(&mut self.max_entries, max_entries);
        set(&mut self.max_bytes, max_bytes);
        set(&mut self.max_entry_bytes, max_entry_bytes);
        set(&mut self.cache_length_finish, cache_length_finish);
        set(&mut self.complete_on_disconnect, complete_on_disconnect);
        set(&mut self.disconnect_budget_ms, disconnect_budget_ms);
        set(&mut self.model_dir, model_dir);
        set(&mut self.ort_lib, ort_lib);
        set(&mut self.semantic, semantic);
        set(&mut self.live.similarity_threshold, similarity_threshold);
        set(&mut self.embed_deadline_ms, embed_deadline_ms);
        if embed_threads.is_some() {
            self.embed_threads = embed_threads;
        }
        set(&mut self.embed_queue_budget_ms, embed_queue_budget_ms);
        set(&mut self.semantic_overlap, semantic_overlap);
        set(&mut self.live.semantic_guards, semantic_guards);
        if otlp_endpoint.is_some() {
            self.otlp_endpoint = otlp_endpoint;
        }
        set(&mut self.live.verify, verify);
        set(&mut self.live.verify_mode, verify_mode);
        set(&mut self.live.verify_floor, verify_floor);
        if let Some(budget) = max_wrong {
            self.live.max_wrong = budget.0;
        }
        if judge_model.is_some() {
            self.live.judge_model = judge_model;
        }
        if judge_url.is_some() {
            self.live.judge_url = judge_url;
        }
        if let Some(key) = judge_api_key {
            self.judge_api_key = Some(Secret::new(key));
        }
        set(&mut self.live.judge_timeout_ms, judge_timeout_ms);
        set(&mut self.judge_max_concurrency, judge_max_concurrency);
        set(&mut self.judge_rate, judge_rate);
        if judge_prompt.is_some() {
            self.judge_prompt = judge_prompt;
        }
        if prices.is_some() {
            self.prices = prices;
        }
    }

    /// Fails fast, naming the field, on anything the gateway could not run with.
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        self.upstream_url = upstream_base(
            "upstream_url",
            &self.upstream_url,
            "https://api.openai.com/v1",
        )?;
        self.anthropic_upstream_url = upstream_base(
            "anthropic_upstream_url",
            &self.anthropic_upstream_url,
            "https://api.anthropic.com/v1",
        )?;
        self.validate_store()?;
        if let Some(endpoint) = &self.otlp_endpoint {
            crate::otel::check_endpoint(endpoint).map_err(|reason| ConfigError::Invalid {
                field: "otlp_endpoint",
                reason,
            })?;
        }
        for (field, secret) in [
            ("admin_token", &self.admin_token),
            ("upstream_api_key", &self.upstream_api_key),
            ("anthropic_api_key", &self.anthropic_api_key),
            ("judge_api_key", &self.judge_api_key),
        ] {
            if secret
                .as_ref()
                .is_some_and(|s| s.expose().trim().is_empty())
            {
                return Err(ConfigError::Invalid {
                    field,
                    reason: "must not be empty (leave it unset instead)".into(),
                });
            }
        }
        for (field, value) in [
            ("max_body_bytes", self.max_body_bytes as u64),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("request_log_size", self.request_log_size as u64),
            ("max_entries", self.max_entries as u64),
            ("max_bytes", self.max_bytes),
            ("max_entry_bytes", self.max_entry_bytes as u64),
            ("sweep_interval_ms", self.sweep_interval_ms),
            ("embed_deadline_ms", self.embed_deadline_ms),
            ("embed_max_batch", self.embed_max_batch as u64),
            ("index_save_interval_s", self.index_save_interval_s),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid {
                    field,
                    reason: "must be greater than 0".into(),
                });
            }
        }
        for (field, value) in [
            ("client_header_timeout_ms", self.client_header_timeout_ms),
            ("client_body_timeout_ms", self.client_body_timeout_ms),
            ("client_send_timeout_ms", self.client_send_timeout_ms),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms),
        ] {
            // A day is far beyond any sane client timeout, and keeps deadline arithmetic in range.
            if value == 0 || value > MAX_CLIENT_TIMEOUT_MS {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{value} is not between 1 and {MAX_CLIENT_TIMEOUT_MS} ms"),
                });
            }
        }
        if self.max_connections == Some(0) {
            return Err(ConfigError::Invalid {
                field: "max_connections",
                reason:
                    "must be greater than 0 (leave it unset to derive it from the open-file limit)"
                        .into(),
            });
        }
        // More threads than a machine has cores only contend; 256 is past any of them.
        if let Some(threads) = self.embed_threads {
            if !(1..=256).contains(&threads) {
                return Err(ConfigError::Invalid {
                    field: "embed_threads",
                    reason: format!(
                        "{threads} is not between 1 and 256 (leave it unset for the model's default)"
                    ),
                });
            }
        }
        self.live.validate()?;
        self.validate_judge()?;
        self.validate_prices()?;
        self.validate_upper_bounds()
    }

    /// The price table: the file readable and every price a number of 0 or more; namespaces named
    /// as a request can name them.
    fn validate_prices(&self) -> Result<(), ConfigError> {
        if let Some(name) = self
            .namespace_prices
            .keys()
            .find(|n| !crate::policy::is_namespace(n))
        {
            return Err(ConfigError::Invalid {
                field: "namespace_prices",
                reason: format!(
                    "namespace {name:?} is not a namespace name ({})",
                    crate::policy::NAMESPACE_RULE
                ),
            });
        }
        let field = if self.prices.is_some() {
            "prices"
        } else {
            "namespace_prices"
        };
        crate::savings::Prices::build(self.prices.as_deref(), &self.namespace_prices)
            .map(drop)
            .map_err(|reason| ConfigError::Invalid { field, reason })
    }

    /// The judge's start-up settings: a readable instruction, limits in range, and a credential for
    /// background calls (they have no request whose credential they could use).
    fn validate_judge(&self) -> Result<(), ConfigError> {
        if let Some(path) = &self.judge_prompt {
            match std::fs::read_to_string(path) {
                Ok(text) if !text.trim().is_empty() => {}
                Ok(_) => {
                    return Err(ConfigError::Invalid {
                        field: "judge_prompt",
                        reason: format!("{} is empty", path.display()),
                    })
                }
                Err(e) => {
                    return Err(ConfigError::Invalid {
                        field: "judge_prompt",
                        reason: format!("cannot read {}: {e}", path.display()),
                    })
                }
            }
        }
        if !(1..=1024).contains(&self.judge_max_concurrency) {
            return Err(ConfigError::Invalid {
                field: "judge_max_concurrency",
                reason: format!("{} is not from 1 to 1024", self.judge_max_concurrency),
            });
        }
        if !(self.judge_rate.is_finite() && self.judge_rate >= 0.0) {
            return Err(ConfigError::Invalid {
                field: "judge_rate",
                reason: format!("{} is not a rate of 0 or more per second", self.judge_rate),
            });
        }
        if !(1..=1_000_000).contains(&self.judge_queue) {
            return Err(ConfigError::Invalid {
                field: "judge_queue",
                reason: format!("{} is not from 1 to 1000000", self.judge_queue),
            });
        }
        let live = &self.live;
        let background = std::iter::once(live.verify_for(None))
            .chain(
                live.namespace_verify
                    .keys()
                    .map(|n| live.verify_for(Some(n))),
            )
            .find(|plan| {
                plan.judges()
                    && plan.mode == crate::verify::settings::VerifyMode::Async
                    && self.judge_credential(plan).is_none()
            });
        if background.is_some() {
            return Err(ConfigError::Invalid {
                field: "judge_api_key",
                reason: "verify_mode = \"async\" needs judge_api_key (or upstream_api_key when the judge is the upstream): a background call has no request credential to use".into(),
            });
        }
        Ok(())
    }

    /// The key judge calls of `plan` send, when the configuration has one: `judge_api_key`, else
    /// the upstream's key when the judge is the upstream.
    pub fn judge_credential(&self, plan: &crate::verify::settings::VerifyPlan) -> Option<&Secret> {
        self.judge_api_key.as_ref().or_else(|| {
            let to_upstream = plan
                .url
                .as_deref()
                .is_none_or(|u| u.trim_end_matches('/') == self.upstream_url);
            self.upstream_api_key.as_ref().filter(|_| to_upstream)
        })
    }

    /// Upper bounds: a huge duration overflows `Instant + Duration` (a panic on every request that
    /// adds it), and a huge size is an allocation the process cannot make. Each bound is far above
    /// any useful value.
    /// `store = "redis"` needs a `redis_url` the client can parse (one of the forms
    /// [`crate::store::connect`] reads: one server, a cluster, or Sentinels).
    fn validate_store(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            field: "redis_url",
            reason,
        };
        match (self.store, &self.redis_url) {
            (StoreKind::Sled, _) => Ok(()),
            (StoreKind::Redis, None) => Err(invalid(
                "required with store = \"redis\" (e.g. redis://127.0.0.1:6379)".into(),
            )),
            // The client's own parser for each node: what it accepts here, the store connects to
            // at start. Its message never repeats the URL (which may hold a password).
            (StoreKind::Redis, Some(url)) => crate::store::connect::Target::parse(url.expose())
                .map(drop)
                .map_err(invalid),
        }
    }

    fn validate_upper_bounds(&self) -> Result<(), ConfigError> {
        const DAY_MS: u64 = 24 * 3600 * 1000;
        for (field, value, max) in [
            ("connect_timeout_ms", self.connect_timeout_ms, DAY_MS),
            ("first_byte_timeout_ms", self.first_byte_timeout_ms, DAY_MS),
            ("idle_timeout_ms", self.idle_timeout_ms, DAY_MS),
            ("shutdown_grace_ms", self.shutdown_grace_ms, DAY_MS),
            ("disconnect_budget_ms", self.disconnect_budget_ms, DAY_MS),
            ("sweep_interval_ms", self.sweep_interval_ms, DAY_MS),
            // A request never waits longer than this for its embedding: a minute is already absurd.
            ("embed_deadline_ms", self.embed_deadline_ms, 60_000),
            ("embed_max_wait_ms", self.embed_max_wait_ms, 60_000),
            ("embed_queue_budget_ms", self.embed_queue_budget_ms, 60_000),
            ("embed_max_batch", self.embed_max_batch as u64, 1024),
            (
                "index_save_interval_s",
                self.index_save_interval_s,
                DAY_MS / 1000,
            ),
            ("request_log_size", self.request_log_size as u64, 1_000_000),
            ("max_body_bytes", self.max_body_bytes as u64, 1 << 30),
            // Record offsets are u32.
            ("max_entry_bytes", self.max_entry_bytes as u64, 1 << 31),
        ] {
            if value > max {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{value} is above the largest accepted value, {max}"),
                });
            }
        }
        Ok(())
    }

    pub fn cache_settings(&self) -> CacheSettings {
        CacheSettings {
            share_across_keys: self.share_across_keys,
            cache_length_finish: self.cache_length_finish,
            complete_on_disconnect: self.complete_on_disconnect,
            disconnect_budget_ms: self.disconnect_budget_ms,
            max_entries: self.max_entries,
            max_bytes: self.max_bytes,
            max_entry_bytes: self.max_entry_bytes,
            sweep_interval_ms: self.sweep_interval_ms,
        }
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }

    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub fn client_header_timeout(&self) -> Duration {
        Duration::from_millis(self.client_header_timeout_ms)
    }

    pub fn client_body_timeout(&self) -> Duration {
        Duration::from_millis(self.client_body_timeout_ms)
    }

    pub fn client_send_timeout(&self) -> Duration {
        Duration::from_millis(self.client_send_timeout_ms)
    }

    pub fn keepalive_timeout(&self) -> Duration {
        Duration::from_millis(self.keepalive_timeout_ms)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

/// The longest client-side timeout accepted: one day.
const MAX_CLIENT_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

/// An upstream base URL, checked (http or https, no query or fragment) and without its trailing
/// slash, since paths are joined to it later; `field` names it in the error, `example` shows one.
fn upstream_base(field: &'static str, value: &str, example: &str) -> Result<String, ConfigError> {
    let url = reqwest::Url::parse(value).map_err(|e| ConfigError::Invalid {
        field,
        reason: format!("{e} (expected e.g. {example})"),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::Invalid {
            field,
            reason: format!("scheme must be http or https, not {}", url.scheme()),
        });
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::Invalid {
            field,
            reason: "must not carry a query or fragment".into(),
        });
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("reprise.toml");
        std::fs::write(
            &path,
            "upstream_url = \"http://127.0.0.1:9/v1/\"\nidle_timeout_ms = 5\nadmin_token = \"t0k\"\n",
        )
        .expect("write");
        let args = ServeArgs {
            config: Some(path),
            idle_timeout_ms: Some(7),
            ..ServeArgs::default()
        };
        let config = Config::load(&args).expect("valid");
        assert_eq!(config.upstream_url, "http://127.0.0.1:9/v1");
        assert_eq!(
            config.anthropic_upstream_url,
            "https://api.anthropic.com/v1"
        );
        assert_eq!(config.idle_timeout_ms, 7);
        assert_eq!(config.admin_token, Some(Secret::new("t0k")));
        assert_eq!(config.listen, Config::default().listen);
    }

    #[test]
    fn the_anthropic_upstream_is_set_by_file_or_flag_and_shown_by_check_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("reprise.toml");
        std::fs::write(
            &path,
            "anthropic_upstream_url = \"http://127.0.0.1:9/v1/\"\n",
        )
        .expect("write");
        let config = Config::load(&ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        })
        .expect("valid");
        assert_eq!(config.anthropic_upstream_url, "http://127.0.0.1:9/v1");
        assert_eq!(config.upstream_url, Config::default().upstream_url);
        let cli = Cli::try_parse_from([
            "reprise",
            "check-config",
            "--config",
            &path.to_string_lossy(),
            "--anthropic-upstream-url",
            "https://anthropic.example/v1",
        ])
        .expect("valid flags");
        let Command::CheckConfig(args) = cli.command else {
            panic!("parsed as another command");
        };
        let config = Config::load(&args).expect("valid");
        assert_eq!(
            config.anthropic_upstream_url,
            "https://anthropic.example/v1"
        );
        // `check-config` prints the configuration as the file spells it.
        assert!(as_toml::effective(&config)
            .contains("\nanthropic_upstream_url = \"https://anthropic.example/v1\"\n"));
    }

    #[test]
    fn prices_come_from_a_file_flag_or_key_and_per_namespace_from_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let prices = dir.path().join("prices.toml");
        std::fs::write(&prices, "[models]\n\"m\" = { input = 1.0, output = 2.0 }\n")
            .expect("write");
        let path = dir.path().join("reprise.toml");
        std::fs::write(
            &path,
            format!(
                "prices = {:?}\n[namespace_prices.support]\n\"m\" = {{ input = 0.5, output = 0.5 }}\n",
                prices.display().to_string()
            ),
        )
        .expect("write");
        let config = Config::load(&ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        })
        .expect("valid");
        assert_eq!(config.prices.as_deref(), Some(prices.as_path()));
        assert_eq!(config.namespace_prices["support"]["m"].input, 0.5);
        // The flag wins over the file.
        let other = dir.path().join("other.toml");
        std::fs::write(&other, "[models]\n").expect("write");
        let config = Config::load(&ServeArgs {
            config: Some(path.clone()),
            prices: Some(other.clone()),
            ..ServeArgs::default()
        })
        .expect("valid");
        assert_eq!(config.prices.as_deref(), Some(other.as_path()));
        // A namespace that no request could name, or a negative price, stops the start.
        std::fs::write(&path, "[namespace_prices.\"no spaces\"]\n").expect("write");
        let err = Config::load(&ServeArgs {
            config: Some(path.clone()),
            ..ServeArgs::default()
        })
        .expect_err("bad namespace");
        assert!(err.to_string().contains("namespace_prices"), "{err}");
        std::fs::write(
            &path,
            "[namespace_prices.support]\n\"m\" = { input = -1.0, output = 0.0 }\n",
        )
        .expect("write");
        let err = Config::load(&ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        })
        .expect_err("negative");
        assert!(err.to_string().contains("namespace_prices"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "listen_adress = \"0.0.0.0:1\"\n").expect("write");
        let err = Config::from_file(&path).expect_err("unknown key");
        assert!(err.to_string().contains("listen_adress"), "{err}");

        let args = ServeArgs {
            upstream_url: Some("ftp://x/v1".into()),
            ..ServeArgs::default()
        };
        let err = Config::load(&args).expect_err("bad scheme");
        assert!(err.to_string().contains("upstream_url"), "{err}");

        let args = ServeArgs {
            anthropic_upstream_url: Some("ftp://x/v1".into()),
            ..ServeArgs::default()
        };
        let err = Config::load(&args).expect_err("bad scheme");
        assert!(err.to_string().contains("anthropic_upstream_url"), "{err}");

        let args = ServeArgs {
            idle_timeout_ms: Some(0),
            ..ServeArgs::default()
        };
        let err = Config::load(&args).expect_err("zero");
        assert!(err.to_string().contains("idle_timeout_ms"), "{err}");

        for (args, field) in [
            (
                ServeArgs {
                    client_header_timeout_ms: Some(0),
                    ..ServeArgs::default()
                },
                "client_header_timeout_ms",
            ),
            (
                ServeArgs {
                    client_body_timeout_ms: Some(u64::MAX),
                    ..ServeArgs::default()
                },
                "client_body_timeout_ms",
            ),
            (
                ServeArgs {
                    client_send_timeout_ms: Some(0),
                    ..ServeArgs::default()
                },
                "client_send_timeout_ms",
            ),
            (
                ServeArgs {
                    keepalive_timeout_ms: Some(0),
                    ..ServeArgs::default()
                },
                "keepalive_timeout_ms",
            ),
            (
                ServeArgs {
                    max_connections: Some(0),
                    ..ServeArgs::default()
                },
                "max_connections",
            ),
            (
                ServeArgs {
                    embed_threads: Some(0),
                    ..ServeArgs::default()
                },
                "embed_threads",
            ),
            (
                ServeArgs {
                    embed_threads: Some(100_000),
                    ..ServeArgs::default()
                },
                "embed_threads",
            ),
        ] {
            let err = Config::load(&args).expect_err(field);
            assert!(err.to_string().contains(field), "{err}");
        }
    }

    #[test]
    fn out_of_range_numbers_name_their_field() {
        let cases: [(&str, ServeArgs); 6] = [
            (
                "similarity_threshold",
                ServeArgs {
                    similarity_threshold: Some(f32::NAN),
                    ..ServeArgs::default()
                },
            ),
            (
                "first_byte_timeout_ms",
                ServeArgs {
                    first_byte_timeout_ms: Some(u64::MAX),
                    ..ServeArgs::default()
                },
            ),
            (
                "embed_deadline_ms",
                ServeArgs {
                    embed_deadline_ms: Some(u64::MAX),
                    ..ServeArgs::default()
                },
            ),
            (
                "request_log_size",
                ServeArgs {
                    request_log_size: Some(usize::MAX),
                    ..ServeArgs::default()
                },
            ),
            (
                "shutdown_grace_ms",
                ServeArgs {
                    shutdown_grace_ms: Some(u64::MAX / 2),
                    ..ServeArgs::default()
                },
            ),
            (
                "default_ttl_s",
                ServeArgs {
                    default_ttl_s: Some(u64::MAX),
                    ..ServeArgs::default()
                },
            ),
        ];
        for (field, args) in cases {
            let err = Config::load(&args).expect_err(field);
            assert!(
                matches!(&err, ConfigError::Invalid { field: f, .. } if *f == field),
                "{field}: {err}"
            );
        }
        let mut config = Config {
            embed_max_wait_ms: u64::MAX,
            ..Config::default()
        };
        let err = config.validate().expect_err("embed_max_wait_ms");
        assert!(err.to_string().contains("embed_max_wait_ms"), "{err}");
    }

    /// A file with every live setting spelled as the wire spells it.
    const LIVE_FILE: &str = r#"
cache_mode = "Shadow"
replay = "tokens-per-second=20"
semantic_guards = "numbers, negation"
similarity_threshold = 0.8
default_ttl_s = 60

[namespace_thresholds]
support = 0.95

[namespace_modes]
support = "exact-only"
"#;

    #[test]
    fn live_settings_are_typed_where_the_file_and_the_flags_are_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("reprise.toml");
        std::fs::write(&path, LIVE_FILE).expect("write");
        let config = Config::from_file(&path).expect("valid");
        let live = &config.live;
        assert_eq!(live.cache_mode, CacheMode::Shadow);
        assert_eq!(live.replay, Pacing::TokensPerSecond(20.0));
        assert_eq!(live.semantic_guards.to_string(), "numbers,negation");
        assert_eq!((live.similarity_threshold, live.default_ttl_s), (0.8, 60));
        assert_eq!(live.threshold_floor(Some("support")), 0.95);
        assert_eq!(live.namespace_modes["support"], CacheMode::ExactOnly);

        // Flags (and their environment variables, read by the same parser) win over the file.
        let cli = Cli::try_parse_from([
            "reprise",
            "check-config",
            "--config",
            &path.to_string_lossy(),
            "--cache-mode",
            "read-only",
            "--replay",
            "recorded",
            "--semantic-guards",
            "none",
        ])
        .expect("valid flags");
        let Command::CheckConfig(args) = cli.command else {
            panic!("parsed as another command");
        };
        let config = Config::load(&args).expect("valid");
        assert_eq!(config.live.cache_mode, CacheMode::ReadOnly);
        assert_eq!(config.live.replay, Pacing::Recorded);
        assert!(config.live.semantic_guards.is_empty());
        assert_eq!(config.live.namespace_modes["support"], CacheMode::ExactOnly);
    }

    #[test]
    fn a_bad_live_value_in_the_file_is_refused_at_its_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bad.toml");
        for (text, names, line) in [
            ("cache_mode = \"sometimes\"", "cache_mode", 2),
            ("replay = \"fast\"", "replay", 2),
            ("replay = \"tokens-per-second=NaN\"", "replay", 2),
            ("semantic_guards = \"numbers,vibes\"", "semantic_guards", 2),
            ("default_ttl_s = -1", "default_ttl_s", 2),
            ("similarity_threshold = \"high\"", "similarity_threshold", 2),
            ("[namespace_modes]\nsupport = \"sometimes\"", "support", 3),
            // A start-up key keeps its line next to the flattened live ones.
            ("max_entries = \"many\"", "max_entries", 2),
        ] {
            std::fs::write(&path, format!("listen = \"127.0.0.1:1\"\n{text}\n")).expect("write");
            let err = Config::from_file(&path).expect_err(text).to_string();
            assert!(err.contains(names), "{text}: {err}");
            assert!(err.contains(&format!("line {line}")), "{text}: {err}");
        }
        // An unknown key is named, without the misleading position of the whole file.
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\ncache_mod = \"on\"\n").expect("write");
        let err = Config::from_file(&path).expect_err("unknown").to_string();
        assert!(err.contains("unknown field `cache_mod`"), "{err}");
        assert!(!err.contains("line 1"), "{err}");
    }

    #[test]
    fn the_verify_settings_come_from_flags_and_the_file_and_async_needs_a_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("verify.toml");
        std::fs::write(
            &path,
            "verify = \"judge\"\njudge_model = \"gpt-4.1-mini\"\nmax_wrong = 0.02\n[namespace_verify.support]\nverify_floor = 0.85\n",
        )
        .expect("write");
        let cli = Cli::try_parse_from([
            "reprise",
            "check-config",
            "--config",
            path.to_str().expect("utf-8"),
            "--verify-mode",
            "sync",
            "--judge-timeout-ms",
            "900",
        ])
        .expect("valid flags");
        let Command::CheckConfig(args) = cli.command else {
            panic!("parsed as another command");
        };
        let config = Config::load(&args).expect("valid");
        let support = config.live.verify_for(Some("support"));
        assert!(support.judges());
        assert_eq!(support.floor, 0.85);
        assert_eq!(support.max_wrong, Some(0.02));
        assert_eq!(support.timeout, Duration::from_millis(900));
        let mut no_budget = args.clone();
        no_budget.max_wrong = Some("none".parse().expect("none"));
        let config = Config::load(&no_budget).expect("valid");
        assert_eq!(config.live.verify_for(Some("support")).max_wrong, None);
        std::fs::write(&path, "max_wrong = \"none\"\n").expect("write");
        assert_eq!(Config::from_file(&path).expect("none").live.max_wrong, None);
        std::fs::write(&path, "max_wrong = \"lots\"\n").expect("write");
        assert!(Config::from_file(&path).is_err());
        std::fs::write(
            &path,
            "verify = \"judge\"\njudge_model = \"gpt-4.1-mini\"\nmax_wrong = 0.02\n[namespace_verify.support]\nverify_floor = 0.85\n",
        )
        .expect("write");
        // A background call has no request credential: refused at start without a key.
        let mut args = args.clone();
        args.verify_mode = Some(crate::verify::settings::VerifyMode::Async);
        let err = Config::load(&args).expect_err("no key").to_string();
        assert!(err.contains("judge_api_key"), "{err}");
        args.upstream_api_key = Some("sk-upstream".into());
        let config =
            Config::load(&args).expect("the upstream key serves a judge that is the upstream");
        let plan = config.live.verify_for(None);
        assert_eq!(
            config.judge_credential(&plan).map(Secret::expose),
            Some("sk-upstream")
        );
        // Not to another host.
        args.judge_url = Some("http://judge.internal/v1".into());
        assert!(Config::load(&args).is_err());
        args.judge_api_key = Some("sk-judge".into());
        let config = Config::load(&args).expect("its own key");
        let plan = config.live.verify_for(None);
        assert_eq!(
            config.judge_credential(&plan).map(Secret::expose),
            Some("sk-judge")
        );
    }

    #[test]
    fn a_bad_live_value_in_a_flag_is_refused_naming_the_flag() {
        for (flag, value, says) in [
            ("--cache-mode", "sometimes", "is not one of on, off"),
            (
                "--replay",
                "tokens-per-second=0",
                "tokens-per-second must be from",
            ),
            (
                "--semantic-guards",
                "numbers,vibes",
                "is not a comma-separated list",
            ),
        ] {
            let err = Cli::try_parse_from(["reprise", "serve", flag, value])
                .expect_err(flag)
                .to_string();
            assert!(err.contains(flag) && err.contains(says), "{err}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("sk-very-secret");
        assert_eq!(format!("{secret:?}"), "*****");
        let config = Config {
            upstream_api_key: Some(secret),
            ..Config::default()
        };
        assert!(!format!("{config:?}").contains("very-secret"));
    }
    #[test]
    fn the_store_is_sled_unless_redis_is_asked_for_with_a_url() {
        assert_eq!(Config::default().store, StoreKind::Sled);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("reprise.toml");
        std::fs::write(
            &path,
            "store = \"redis\"\nredis_url = \"redis://:pw-in-url@127.0.0.1:6379/2\"\n",
        )
        .expect("write");
        let config = Config::from_file(&path).expect("valid");
        assert_eq!(config.store, StoreKind::Redis);
        assert!(!format!("{config:?}").contains("pw-in-url"));

        let cli = Cli::try_parse_from([
            "reprise",
            "check-config",
            "--store",
            "redis",
            "--redis-url",
            "rediss://cache.internal:6380",
        ])
        .expect("valid flags");
        let Command::CheckConfig(args) = cli.command else {
            panic!("parsed as another command");
        };
        let config = Config::load(&args).expect("valid");
        assert_eq!(config.store, StoreKind::Redis);
        assert_eq!(
            config.redis_url.as_ref().map(Secret::expose),
            Some("rediss://cache.internal:6380")
        );

        for (url, why) in [
            (None, "required"),
            (Some("http://127.0.0.1:6379"), "scheme"),
            (Some("127.0.0.1:6379"), "scheme"),
            (Some("redis://127.0.0.1:notaport"), "redis_url"),
            (
                Some("redis+cluster://:pw@10.0.0.1:7000,,10.0.0.2:7000"),
                "empty host",
            ),
            (Some("redis+cluster://10.0.0.1:notaport"), "redis_url"),
            (Some("redis+sentinel://10.0.0.1:26379"), "master's name"),
            (Some("rediss+sentinel://10.0.0.1:26379/m/x"), "number"),
        ] {
            let args = ServeArgs {
                store: Some(StoreKind::Redis),
                redis_url: url.map(str::to_owned),
                ..ServeArgs::default()
            };
            let err = Config::load(&args).expect_err(why).to_string();
            assert!(err.contains("redis_url") && err.contains(why), "{err}");
        }
        // The cluster and Sentinel forms are accepted as they are.
        for url in [
            "redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000",
            "rediss+cluster://cache-0.internal:6379",
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster/2",
            "rediss+sentinel://user:pw@sentinel.internal:26379/mymaster",
        ] {
            let args = ServeArgs {
                store: Some(StoreKind::Redis),
                redis_url: Some(url.to_owned()),
                ..ServeArgs::default()
            };
            let config = Config::load(&args).expect(url);
            assert_eq!(config.redis_url.as_ref().map(Secret::expose), Some(url));
        }
        assert!(Cli::try_parse_from(["reprise", "check-config", "--store", "postgres"]).is_err());
    }
}
