//! `scale-gateway`: the gateway with a big cache, for `benches/scale.sh --gateway` (issue 22). It is
//! `reprise serve` (the same flags, the same allocator, the same start-up) that first writes
//! `--entries` synthetic entries through the gateway's own code path for a stored entry (what
//! `POST /admin/entries` does: `Store::put`, then the vector into the index), then serves; or, with
//! `--store-only`, writes them into the store alone (a sled data dir or a Redis) and exits, for
//! other replicas to load. No upstream call and no embedding: the vectors are synthetic.
//!
//! The entries look like a support cache's: prompts of 8–24 words and answers of 16–48 words (as
//! events and a body, like a warmed entry), vectors of the model's dimension clustered by topic as
//! prompt embeddings are (topics of about 100 prompts, members at cosine about 0.5 to each other),
//! in four namespaces of realistic sizes: `support` 60% (the big partition the bench's real
//! questions go into), `docs` 25%, `sales` 10%, and 50 small tenants' namespaces `team-00`..`team-49`
//! sharing the last 5%. Deterministic for a `--seed`. It must not measure anything itself: the
//! script reads the process from outside (RSS, `/healthz`, the bench driver).
//!
//! Usage: `scale-gateway --entries N [--seed S] [--store-only] [reprise serve flags...]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reprise_server::config::{Config, ServeArgs};
use reprise_server::entry::{Entry, EntryId, RequestSummary};
use reprise_server::index::VectorIndex;
use reprise_server::ingress::Route;
use reprise_server::key::{KeyInput, Tenant};
use reprise_server::store::Store;
use reprise_server::timing::Phases;
use serde_json::Value;

// The gateway's allocator (server/src/main.rs): RSS figures must be the gateway's.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "scale-gateway",
    about = "reprise serve with N synthetic entries written first"
)]
struct Args {
    /// Synthetic entries to write before serving.
    #[arg(long)]
    entries: usize,
    /// Seed of the prompts, answers and vectors.
    #[arg(long, default_value_t = 22)]
    seed: u64,
    /// Write the entries into the store only (no index), flush and exit: a data dir or a Redis for
    /// other replicas to load.
    #[arg(long)]
    store_only: bool,
    /// The model name of the entries (the bench driver's default), which is in the partition key.
    #[arg(long, default_value = "sim-model")]
    model: String,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Namespaces and their shares of the entries; the `team-` ones split the rest.
const NAMESPACES: [(&str, f64); 3] = [("support", 0.60), ("docs", 0.25), ("sales", 0.10)];
const TEAMS: usize = 50;
const TOPIC_SIZE: usize = 100;

const WORDS: &[&str] = &[
    "account",
    "password",
    "reset",
    "invoice",
    "billing",
    "refund",
    "order",
    "shipping",
    "delivery",
    "address",
    "change",
    "cancel",
    "subscription",
    "plan",
    "upgrade",
    "download",
    "install",
    "error",
    "login",
    "email",
    "phone",
    "verify",
    "card",
    "payment",
    "failed",
    "tracking",
    "return",
    "warranty",
    "device",
    "settings",
    "update",
    "version",
    "export",
    "report",
    "team",
    "member",
    "invite",
    "permission",
    "admin",
    "project",
    "file",
    "upload",
    "limit",
    "storage",
    "backup",
    "restore",
    "sync",
    "calendar",
    "meeting",
    "notification",
    "language",
    "timezone",
    "currency",
    "tax",
    "discount",
    "coupon",
    "trial",
    "contract",
    "license",
    "api",
    "key",
    "token",
    "webhook",
    "integration",
    "slack",
    "export",
    "csv",
    "pdf",
    "print",
    "mobile",
    "app",
    "browser",
    "cache",
    "slow",
    "crash",
    "screen",
    "dark",
    "mode",
    "font",
    "size",
    "search",
    "filter",
    "sort",
    "tag",
];
const ASKS: &[&str] = &[
    "How do I",
    "How can I",
    "Why can't I",
    "What happens if I",
    "Is it possible to",
    "Where do I",
    "Can you explain how to",
    "What is the best way to",
    "When should I",
    "Who can",
];

fn words(rng: &mut StdRng, n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out
}

fn gauss(rng: &mut StdRng) -> f32 {
    let u: f32 = rng.random_range(f32::EPSILON..1.0);
    let v: f32 = rng.random_range(0.0..1.0);
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

/// The namespace of entry `i` of `n`: the first 60% `support`, and so on, so each namespace's
/// entries are contiguous and its topics its own.
fn namespace(i: usize, n: usize) -> String {
    let mut start = 0.0;
    for (name, share) in NAMESPACES {
        start += share;
        if (i as f64) < start * n as f64 {
            return name.to_owned();
        }
    }
    format!("team-{:02}", i % TEAMS)
}

/// Entry `i`: a topic's member vector (topic `i / TOPIC_SIZE`, its centre seeded by the topic), a
/// prompt and an answer, all from `seed` and `i`.
fn synthetic(seed: u64, i: usize, dim: usize) -> (String, String, Vec<f32>) {
    let topic = i / TOPIC_SIZE;
    let mut centre_rng = StdRng::seed_from_u64(seed ^ (topic as u64).wrapping_mul(0x9e37_79b9));
    let centre = unit((0..dim).map(|_| gauss(&mut centre_rng)).collect());
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64).wrapping_mul(0x2545_f491));
    let noise = unit((0..dim).map(|_| gauss(&mut rng)).collect());
    // cos(member, centre) ≈ 0.71, so two members of a topic sit near cosine 0.5.
    let vector = unit(
        centre
            .iter()
            .zip(&noise)
            .map(|(c, e)| 0.71 * c + 0.70 * e)
            .collect(),
    );
    let ask = ASKS[rng.random_range(0..ASKS.len())];
    let prompt_words = rng.random_range(6..22);
    let prompt = format!("{ask} {} (case {i})?", words(&mut rng, prompt_words));
    // About the 32-token answers of benches/replicas.sh: each word is a stream event in the replay.
    let answer_words = rng.random_range(16..48);
    let answer = format!("{}.", words(&mut rng, answer_words));
    (prompt, answer, vector)
}

/// The entry `POST /admin/entries` would store for this prompt and answer (keyed by the same
/// adapter), with `vector`.
fn entry(
    config: &Config,
    model: &str,
    namespace: &str,
    prompt: String,
    answer: String,
    vector: Vec<f32>,
) -> Option<Entry> {
    let api = reprise_server::api::of(Route::ChatCompletions);
    let warm = api.warm()?;
    let mut body = warm.prompt(prompt);
    body.insert("model".to_owned(), Value::String(model.to_owned()));
    let tenant = Tenant::from_headers(&http::HeaderMap::new(), config.share_across_keys);
    let keys = reprise_server::api::keys(&KeyInput {
        route: Route::ChatCompletions,
        body: &body,
        headers: &http::HeaderMap::new(),
        tenant,
        namespace: Some(namespace),
    })
    .ok()?;
    let now_ms = reprise_server::timing::unix_ms();
    let answer = warm.answer(model.to_owned(), answer, now_ms / 1000);
    Some(Entry {
        id: EntryId(0),
        key: keys.exact,
        partition: keys.partition,
        summary: RequestSummary {
            route: Route::ChatCompletions.name().to_owned(),
            model: model.to_owned(),
            namespace: Some(namespace.to_owned()),
            tenant: tenant.label(),
            prompt: keys.prompt,
            stream: false,
        },
        events: api.rechunk(&answer, 0.0),
        body: answer,
        usage: None,
        phases: Phases::default(),
        created_at_ms: now_ms,
        ttl_ms: config.live.default_ttl_s.saturating_mul(1000),
        hit_count: 0,
        last_hit_ms: 0,
        vector: Some(vector),
        hit_history: Vec::new(),
        warmed: true,
    })
}

/// Puts `entry`, trying again after 0.2, 0.4, 0.8 and 1.6 s when the store fails: a Redis that
/// answers late once (its I/O timeout is short, and a million writes meet a busy moment) used
/// to end a load of many minutes with nothing to show for it.
fn put_patiently(store: &dyn Store, entry: Entry) -> Result<EntryId, String> {
    let mut wait = Duration::from_millis(200);
    for _ in 0..4 {
        match store.put(entry.clone()) {
            Ok(id) => return Ok(id),
            Err(e) => eprintln!("scale-gateway: store: {e}; trying again in {wait:?}"),
        }
        std::thread::sleep(wait);
        wait *= 2;
    }
    store.put(entry).map_err(|e| format!("store: {e}"))
}

/// Writes entries `0..n` from every core: each entry through `store.put`, then (unless
/// `store_only`) its vector into `index`, as a warmed entry is stored.
fn write_all(
    args: &Args,
    config: &Config,
    store: &Arc<dyn Store>,
    index: Option<&Arc<dyn VectorIndex>>,
    dim: usize,
) -> Result<(), String> {
    let n = args.entries;
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |t| t.get());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        let ns = namespace(i, n);
                        let (prompt, answer, vector) = synthetic(args.seed, i, dim);
                        let entry = entry(config, &args.model, &ns, prompt, answer, vector)
                            .ok_or("cannot key a synthetic entry")?;
                        let (partition, vector) = (entry.partition.0, entry.vector.clone());
                        let id = put_patiently(store.as_ref(), entry)?;
                        if let (Some(index), Some(vector)) = (index, vector) {
                            index.insert(id.0, partition, &vector);
                        }
                        let count = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if count.is_multiple_of((n / 20).max(1)) {
                            eprintln!(
                                "scale-gateway: {count} of {n} entries written in {:.1} s",
                                started.elapsed().as_secs_f64()
                            );
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .map_err(|_| "a writer thread panicked".to_owned())?
        })
    })?;
    eprintln!(
        "scale-gateway: wrote {n} entries in {:.1} s{}",
        started.elapsed().as_secs_f64(),
        if index.is_some() {
            " (store and index)"
        } else {
            " (store only)"
        }
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scale-gateway: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let config = Config::load(&args.serve).map_err(|e| e.to_string())?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,reprise_server=info".into()),
        )
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let state = reprise_server::AppState::new(config.clone()).map_err(|e| e.to_string())?;
        let dim = state
            .semantic
            .as_ref()
            .map_or(384, |s| s.embedder.dimension());
        let store = state.cache.store.clone();
        let index = (!args.store_only)
            .then(|| state.cache.index.clone())
            .flatten();
        let (args, writer_config) = (Arc::new(args), config.clone());
        let job = args.clone();
        tokio::task::spawn_blocking(move || {
            write_all(&job, &writer_config, &store, index.as_ref(), dim)?;
            store.flush().map_err(|e| format!("flush: {e}"))
        })
        .await
        .map_err(|e| e.to_string())??;
        if args.store_only {
            if let Some(semantic) = &state.semantic {
                semantic.stop();
            }
            return Ok(());
        }
        reprise_server::run(listener, state, reprise_server::shutdown_signal())
            .await
            .map_err(|e| e.to_string())
    })
}
