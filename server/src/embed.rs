//! Embed stage: turns a prompt into a unit vector with a local ONNX model; it must never run model work
//! on a tokio worker and never make a request wait past its deadline (a late vector is worth less than
//! falling back to exact matching).
//!
//! Callers send `(texts, reply, deadline)` jobs over a channel to one dedicated `std::thread`. A
//! deadline-bound text is admitted when the model is idle and the batch being gathered has room for
//! it, or when its expected wait for its vector (what is left of the running call, the full batches
//! queued ahead of it, and its own batch's call, by a cost model `fixed + per_text × n` fitted to
//! the measured calls) fits `queue_budget`. Anything else is refused at once with
//! [`EmbedError::Overloaded`] (the caller falls back to exact matching and the entry is embedded
//! later, off the request path). The thread
//! blocks for the first job and takes every job already queued behind it; only when the last model
//! call had company (several callers at once: load) does it also wait, up to `max_wait` after the
//! first arrival or until `max_batch` texts, for more. A lone caller at low load never waits for a
//! batch that will not come. It drops jobs whose deadline already passed or whose caller has gone, runs one model call for the rest,
//! and answers each job through its oneshot. The model sits behind [`EmbedModel`], so tests can drive
//! batching, deadlines and failures with a fake in milliseconds; [`FastembedModel`] is the real one
//! (fastembed over ONNX Runtime, loaded from the `.so` that `scripts/provision-models.sh` provides).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The file, inside a model directory, that says how to run the model in it.
pub const MODEL_SPEC_FILE: &str = "reprise-model.toml";

/// How many recent batches [`Embedder::recent_batches`] remembers.
const RECENT_BATCHES: usize = 128;

/// How many recent model calls the cost model is fitted to: enough to span several batch sizes,
/// few enough to follow a change of CPU contention within a second or two of load.
const FIT_SAMPLES: usize = 32;

/// The default of `queue_budget` (`embed_queue_budget_ms`): the expected wait for its vector that a
/// miss may accept. While the embedder keeps up, the texts arriving during one model call fit in
/// the next batch, so no text waits longer than a full batch running and then its own full batch:
/// two calls of `embed_max_batch` (16) texts, 2 × 49 ms on this repository's 2-core reference
/// machine (release build; `benches/admission.sh`). Against the 400 ms to seconds a hosted model
/// takes to its first token, a semantic hit saves far more than that wait costs a true miss.
pub const DEFAULT_QUEUE_BUDGET_MS: u64 = 100;

/// How the server runs the model in a directory, read from its [`MODEL_SPEC_FILE`].
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Length of the vectors the model produces; checked against a real output at load.
    pub dimension: usize,
    /// `"mean"` or `"cls"`: how token vectors become one sentence vector.
    pub pooling: String,
    /// Whether vectors are L2-normalized; fastembed always does it, so only `true` is accepted.
    pub normalize: bool,
    /// Tokens kept per text; longer texts are truncated.
    pub max_length: usize,
    /// Each text in a run of its own instead of a batch in one run. A model that quantizes its
    /// activations per run (dynamic int8, as provisioned) needs it: the scale is taken over the
    /// whole input, padding and the other texts included, so a text's vector would depend on the
    /// texts beside it (cosine 0.990-0.994 to its vector alone, measured on the provisioned model).
    #[serde(default)]
    pub one_text_per_run: bool,
}

impl ModelSpec {
    /// Reads and validates `<model_dir>/reprise-model.toml`.
    pub fn read(model_dir: &Path) -> Result<ModelSpec, EmbedError> {
        let path = model_dir.join(MODEL_SPEC_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            EmbedError::Load(format!(
                "cannot read {}: {e} (run scripts/provision-models.sh)",
                path.display()
            ))
        })?;
        let spec: ModelSpec = toml::from_str(&text)
            .map_err(|e| EmbedError::Load(format!("invalid {}: {e}", path.display())))?;
        spec.validate()
            .map_err(|e| EmbedError::Load(format!("invalid {}: {e}", path.display())))?;
        Ok(spec)
    }

    /// Fails fast with the name of the first field that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.dimension == 0 {
            return Err("`dimension` must be at least 1".into());
        }
        if self.max_length == 0 {
            return Err("`max_length` must be at least 1".into());
        }
        if !self.normalize {
            // fastembed L2-normalizes every output; accepting `false` would silently lie.
            return Err(
                "`normalize = false` is not supported (vectors are always L2-normalized)".into(),
            );
        }
        self.fastembed_pooling().map(|_| ())
    }

    fn fastembed_pooling(&self) -> Result<fastembed::Pooling, String> {
        match self.pooling.as_str() {
            "mean" => Ok(fastembed::Pooling::Mean),
            "cls" => Ok(fastembed::Pooling::Cls),
            other => Err(format!(
                "`pooling` must be \"mean\" or \"cls\", not {other:?}"
            )),
        }
    }
}

/// Settings of the embed stage.
#[derive(Debug, Clone)]
pub struct EmbedConfig {
    /// Directory holding `model.onnx`, the tokenizer files and `reprise-model.toml`.
    pub model_dir: PathBuf,
    /// The ONNX Runtime shared library to load.
    pub ort_lib: PathBuf,
    /// How long [`Embedder::embed`] may take, queueing included, before it gives up.
    pub deadline: Duration,
    /// Most texts in one model call.
    pub max_batch: usize,
    /// How long the worker waits after a batch's first arrival for company, when the last model call
    /// had some; a lone caller's call starts at once.
    pub max_wait: Duration,
    /// Longest expected wait for its vector (queued model work ahead of it and its own batch's
    /// call) that a deadline-bound text may accept; zero admits texts only while the model is idle.
    pub queue_budget: Duration,
    /// ONNX Runtime intra-op threads (the worker thread counts as one of them); `None`: the
    /// model's own default, one for a model run one text at a time, else one per core.
    pub threads: Option<usize>,
}

impl Default for EmbedConfig {
    fn default() -> Self {
        let (model_dir, ort_lib) = default_paths();
        EmbedConfig {
            model_dir,
            ort_lib,
            deadline: Duration::from_millis(250),
            max_batch: 32,
            max_wait: Duration::from_millis(2),
            queue_budget: Duration::from_millis(DEFAULT_QUEUE_BUDGET_MS),
            threads: None,
        }
    }
}

impl EmbedConfig {
    /// Fails fast with the name of the field that cannot work.
    pub fn validate(&self) -> Result<(), EmbedError> {
        let bad = |msg: &str| Err(EmbedError::Load(msg.to_owned()));
        if self.deadline.is_zero() {
            return bad("embed `deadline` must be above zero");
        }
        if self.max_batch == 0 {
            return bad("embed `max_batch` must be at least 1");
        }
        if self.threads == Some(0) {
            return bad("embed `threads` must be at least 1");
        }
        Ok(())
    }
}

/// Where provisioned files live by default, relative to the working directory.
pub fn default_paths() -> (PathBuf, PathBuf) {
    let lib = format!(
        "{}onnxruntime{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    (
        PathBuf::from("models/all-MiniLM-L6-v2"),
        PathBuf::from("models/onnxruntime").join(lib),
    )
}

/// Why no vector came back.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    #[error("embedding model failed to load: {0}")]
    Load(String),
    #[error("embedding deadline passed")]
    Timeout,
    /// Refused without queueing: the work already queued would not let this call meet its deadline.
    #[error("embedding queue overloaded")]
    Overloaded,
    #[error("embedding failed: {0}")]
    Failed(String),
    #[error("embedding worker has stopped")]
    Closed,
}

/// Counters of the embed stage, for the admin API and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EmbedStats {
    /// Texts callers asked for (`embed` counts 1, `embed_many` counts its texts).
    pub requests: u64,
    /// Model calls made.
    pub batches: u64,
    /// Texts that went through the model.
    pub batched_items: u64,
    /// `embed` calls that ended in [`EmbedError::Timeout`].
    pub timeouts: u64,
    /// `embed` calls refused at once with [`EmbedError::Overloaded`].
    pub overloaded: u64,
    /// Texts queued or in the model right now.
    pub pending: u64,
    /// Calls that ended in [`EmbedError::Failed`] or [`EmbedError::Closed`].
    pub failures: u64,
    /// Largest batch so far.
    pub max_batch_seen: u64,
    /// Longest a deadline-bound text waited between its call and the start of its model call, in
    /// microseconds (admission keeps it within `embed_queue_budget_ms`).
    pub max_queue_wait_us: u64,
    /// The cost model admission works from, fitted to the last calls: a call of `n` texts is
    /// expected to take `call_fixed_ms + n × call_per_text_ms` (`None` before the first call).
    pub call_fixed_ms: Option<f64>,
    pub call_per_text_ms: Option<f64>,
}

/// One model call, for latency histograms.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BatchSample {
    pub size: usize,
    pub millis: f64,
}

/// A model that turns texts into vectors; the seam that lets tests replace ONNX with a fake.
///
/// It runs only on the embed worker thread, hence `&mut self` and `Send` without `Sync`.
pub trait EmbedModel: Send {
    /// One vector of [`EmbedModel::dimension`] floats per text, in order.
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String>;
    fn dimension(&self) -> usize;
    /// What makes two models' vectors comparable: replicas sharing a store check it before they
    /// match against each other's vectors. The default (for test models) is the dimension alone.
    fn fingerprint(&self) -> String {
        format!("dimension={}", self.dimension())
    }
}

/// The real model: fastembed's ONNX text embedding with the pooling from `reprise-model.toml`.
pub struct FastembedModel {
    inner: fastembed::TextEmbedding,
    /// ONNX Runtime intra-op threads it runs with.
    threads: usize,
    dimension: usize,
    fingerprint: String,
    /// Texts per ONNX run: the batch's size, or 1 ([`ModelSpec::one_text_per_run`]).
    one_text_per_run: bool,
    /// What the tokenizer is given of each text ([`tokenized_bytes`]).
    tokenized_bytes: usize,
}

impl FastembedModel {
    /// Loads ONNX Runtime (once per process), the tokenizer and the model, then checks the output width.
    /// Blocking: reads ~90 MB and builds the ONNX session.
    pub fn load(config: &EmbedConfig) -> Result<FastembedModel, EmbedError> {
        // ort and fastembed have `expect`s on odd dylibs; a bad install must be an error, not a crash.
        catch_unwind(AssertUnwindSafe(|| Self::load_inner(config))).unwrap_or_else(|panic| {
            Err(EmbedError::Load(format!(
                "panicked while loading: {}",
                panic_message(panic.as_ref())
            )))
        })
    }

    fn load_inner(config: &EmbedConfig) -> Result<FastembedModel, EmbedError> {
        config.validate()?;
        // The tokenizer hands every batch to rayon's pool and blocks until a pool thread has
        // tokenized it, even a batch of one text, which is every call of a one-text-per-run model:
        // two thread wake-ups for a short text's tokenizing. Tokenized on the worker's own thread,
        // a semantic hit's TTFT went 4.79 -> 4.47 ms at concurrency 1 and 14.42 -> 15.42 ms at 8
        // in one gateway A/B (within the spread of such runs), and back-to-back calls in
        // `benches/benches/embed.rs` showed no difference: kept for the hand-off it removes. A
        // batch of many texts loses its parallel tokenizing, a small part of a model call that
        // takes milliseconds per text. Process-wide, and the same for every model loaded.
        tokenizers::utils::parallelism::set_parallelism(false);
        let spec = ModelSpec::read(&config.model_dir)?;
        let pooling = spec.fastembed_pooling().map_err(EmbedError::Load)?;
        let threads = config
            .threads
            .unwrap_or_else(|| default_threads(spec.one_text_per_run));
        let read = |name: &str| {
            let path = config.model_dir.join(name);
            std::fs::read(&path).map_err(|e| {
                EmbedError::Load(format!(
                    "cannot read {}: {e} (run scripts/provision-models.sh)",
                    path.display()
                ))
            })
        };
        let tokenizer = fastembed::TokenizerFiles {
            tokenizer_file: read("tokenizer.json")?,
            config_file: read("config.json")?,
            special_tokens_map_file: read("special_tokens_map.json")?,
            tokenizer_config_file: read("tokenizer_config.json")?,
        };
        // fastembed's default pooling is CLS, which is wrong for sentence-transformers models such as
        // MiniLM; the spec file is the authority.
        let onnx = read("model.onnx")?;
        // The weights, the tokenizer and the spec (pooling, length) decide the vectors; the ONNX
        // Runtime version does not, beyond float noise.
        let mut hasher = blake3::Hasher::new();
        hasher.update(&onnx);
        hasher.update(&tokenizer.tokenizer_file);
        hasher
            .update(format!("{}/{}/{}", spec.pooling, spec.max_length, spec.dimension).as_bytes());
        let fingerprint = format!("blake3:{}", &hasher.finalize().to_hex()[..32]);
        let model = fastembed::UserDefinedEmbeddingModel::new(onnx, tokenizer)
            .with_pooling(pooling)
            .with_quantization(fastembed::QuantizationMode::None);
        let options = fastembed::InitOptionsUserDefined::new()
            .with_environment(ort_environment(&config.ort_lib)?)
            .with_max_length(spec.max_length)
            .with_intra_threads(threads)
            // ONNX Runtime's pool threads spin after each run by default; with a small core count that
            // spinning steals the CPU the tokio workers need between batches, for no gain here.
            .with_session_config("session.intra_op.allow_spinning", "0");
        let inner = fastembed::TextEmbedding::try_new_from_user_defined(model, options)
            .map_err(|e| EmbedError::Load(format!("{}: {e}", config.model_dir.display())))?;
        let mut model = FastembedModel {
            inner,
            threads,
            dimension: spec.dimension,
            fingerprint,
            one_text_per_run: spec.one_text_per_run,
            tokenized_bytes: tokenized_bytes(spec.max_length),
        };
        // One real call proves the spec matches the model and warms the session (the first run is slow).
        let probe = model
            .embed(&["warm-up".to_owned()])
            .map_err(EmbedError::Load)?;
        let width = probe.first().map_or(0, Vec::len);
        if width != spec.dimension {
            return Err(EmbedError::Load(format!(
                "{} says dimension = {}, but the model produces {width}",
                config.model_dir.join(MODEL_SPEC_FILE).display(),
                spec.dimension
            )));
        }
        Ok(model)
    }
}

/// ONNX Runtime intra-op threads for a model whose config names none. A model that runs one text
/// per run gets one: a short text's run is about a hundred operators, each too small to split, and
/// waking a second thread for each costs more than it saves. On the 2-core reference machine two
/// threads made the semantic hit's TTFT p50 1.19x (concurrency 1) and 1.27x (concurrency 8) of one
/// thread's, with 0.79-0.84x the texts per second of model time
/// (`benches/results/2026-12-07-embed-threads-tokenizer.md`; `2026-12-05-embed-threads.md` found
/// the same). One thread's p99 at concurrency 1 was higher in every run (6.5 -> 8.5, 9.8 -> 14.2,
/// 20.3 -> 22.2 ms; why is not measured). A model
/// that runs whole batches gets one per core, which a batch's larger products can use.
fn default_threads(one_text_per_run: bool) -> usize {
    if one_text_per_run {
        1
    } else {
        crate::priority::cores()
    }
}

/// The least of a text the tokenizer is given, in bytes; [`tokenized_bytes`] gives a model that
/// reads more tokens more. The model reads its first `max_length` tokens (256 for MiniLM) and the
/// tokenizer drops the rest, but only after splitting the whole text: a 2 MiB prompt took 4 s of
/// the embedding worker, a 20 MiB one 58 s, and the worker's cost model then refused every lookup
/// for the next 30 misses. A WordPiece token of a word covers at most 100 characters (a longer
/// word is one `[UNK]`), so 256 tokens of words lie within about 26 KB: a cut at 64 KiB leaves
/// every such text's tokens, and so its vector, as they were. (A text that opens with long runs
/// without a break, each one `[UNK]`, can lose tokens the model would have read: the price of a
/// bound.)
const TOKENIZED_BYTES: usize = 64 * 1024;

/// What the tokenizer is given of each text for a model that reads `max_length` tokens: 256 bytes
/// a token (more than 100 characters of a word and its separator, in UTF-8), at least
/// [`TOKENIZED_BYTES`].
fn tokenized_bytes(max_length: usize) -> usize {
    max_length.saturating_mul(256).max(TOKENIZED_BYTES)
}

/// `text` cut to `limit` bytes, at a character boundary.
fn tokenized_part(text: &str, limit: usize) -> &str {
    &text[..text.floor_char_boundary(limit)]
}

impl EmbedModel for FastembedModel {
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        // One ONNX run for the whole batch (the worker already sized it), or one per text when
        // the model's vectors would depend on their batch: the call still serves the whole batch.
        let per_run = if self.one_text_per_run {
            1
        } else {
            texts.len().max(1)
        };
        let texts: Vec<&str> = texts
            .iter()
            .map(|t| tokenized_part(t, self.tokenized_bytes))
            .collect();
        self.inner
            .embed(texts, Some(per_run))
            .map_err(|e| e.to_string())
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    fn fingerprint(&self) -> String {
        self.fingerprint.clone()
    }
}

/// Times a few calls of one text and of a full batch, so that admission knows from the start what
/// batching saves (without them the first calls, all single, would make a batch look as dear as
/// that many single calls). The texts are of a typical question's length.
fn calibrate(model: &mut dyn EmbedModel, max_batch: usize) -> VecDeque<(u64, Duration)> {
    let text = |n: usize| {
        format!("How do I reset my password if I can no longer reach the email address on my account? ({n})")
    };
    let mut samples = VecDeque::new();
    let sizes = [1, max_batch, 1, max_batch, 1];
    for (round, size) in sizes.into_iter().enumerate() {
        let texts: Vec<String> = (0..size).map(|n| text(round * max_batch + n)).collect();
        let started = Instant::now();
        if model.embed(&texts).is_ok() {
            samples.push_back((size as u64, started.elapsed()));
        }
    }
    samples
}

/// The process's ONNX Runtime environment. ort allows building only one per process, ever (even after
/// the first is dropped), so it is built once and shared by every model loaded later.
fn ort_environment(lib: &Path) -> Result<ort::environment::Environment, EmbedError> {
    static ENVIRONMENT: Mutex<Option<ort::environment::Environment>> = Mutex::new(None);
    let mut slot = ENVIRONMENT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(env) = slot.as_ref() {
        return Ok(env.clone());
    }
    // ort resolves a relative path against the executable's directory first; we mean the working dir.
    let lib = std::path::absolute(lib).unwrap_or_else(|_| lib.to_path_buf());
    if !lib.is_file() {
        return Err(EmbedError::Load(format!(
            "ONNX Runtime library not found at {} (run scripts/provision-models.sh)",
            lib.display()
        )));
    }
    let env = ort::init_from(&lib)
        .map_err(|e| EmbedError::Load(format!("ONNX Runtime: {e}")))?
        .with_name("reprise-embed")
        .with_telemetry(false)
        .build()
        .map_err(|e| EmbedError::Load(format!("ONNX Runtime environment: {e}")))?;
    *slot = Some(env.clone());
    Ok(env)
}

type Reply = Result<Vec<Vec<f32>>, EmbedError>;

/// One caller's texts on their way to the worker.
struct Job {
    texts: Vec<String>,
    /// `texts.len()` when sent: what the job adds to [`Counters::pending`] until it is answered.
    count: u64,
    /// `None` for admin/warm-up work that may wait as long as it takes.
    deadline: Option<Instant>,
    enqueued_at: Instant,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    batches: AtomicU64,
    batched_items: AtomicU64,
    timeouts: AtomicU64,
    overloaded: AtomicU64,
    failures: AtomicU64,
    max_batch_seen: AtomicU64,
    /// Texts sent and not yet answered (queued, gathering or in the model).
    pending: AtomicU64,
    /// Where the next batch stands: admission reads and takes a place in it in one step.
    queue: Mutex<Queue>,
    max_queue_wait_us: AtomicU64,
    /// When the last deadline-bound text was refused, in nanoseconds after `epoch` (0: never).
    refused_at_ns: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
    /// Told of the queue wait of every deadline-bound text that reaches the model.
    wait_observer: std::sync::OnceLock<WaitObserver>,
    recent: Mutex<VecDeque<BatchSample>>,
    /// Told of every model call (the metrics histograms).
    observer: std::sync::OnceLock<BatchObserver>,
}

/// Called with the size and model time of every batch.
pub type BatchObserver = Box<dyn Fn(usize, Duration) + Send + Sync>;

/// Called with how long a deadline-bound text waited before its model call started.
pub type WaitObserver = Box<dyn Fn(Duration) + Send + Sync>;

/// What admission must know about the worker, changed only under its lock: deciding whether a text
/// may wait and taking its place are one step, so a burst cannot slip past between the two.
#[derive(Debug, Default)]
struct Queue {
    /// Texts sent and not yet in a model call (in the channel, carried, or being gathered).
    waiting: u64,
    /// A batch is closed: its model call runs (or is about to).
    running: Option<Running>,
    /// What a model call costs, fitted to the last calls; `None` until one was measured.
    cost: Option<Cost>,
}

/// The model call in progress.
#[derive(Debug, Clone, Copy)]
struct Running {
    since: Instant,
    texts: u64,
}

/// What one model call of `n` texts takes: `fixed + per_text × n`. A batch costs less per text than
/// single calls (one ONNX run, one set of kernel launches and thread wake-ups): all-MiniLM-L6-v2 on
/// 2 cores takes about 7.6 ms for 1 text but 93 ms for 32, 2.9 ms each. An estimate per text taken
/// from single calls overstates a batch's cost several times over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub fixed: Duration,
    pub per_text: Duration,
}

impl Cost {
    /// The expected time of one model call of `texts` texts.
    pub fn of(&self, texts: u64) -> Duration {
        self.fixed.saturating_add(
            self.per_text
                .saturating_mul(u32::try_from(texts).unwrap_or(u32::MAX)),
        )
    }

    /// Least squares over `(texts, took)` samples. Samples of one size cannot separate the two terms:
    /// then `previous` is scaled to their mean (keeping its shape), or without one the whole time is
    /// taken as per-text (pessimistic for larger batches until calls of other sizes are seen).
    fn fit(samples: &VecDeque<(u64, Duration)>, previous: Option<Cost>) -> Option<Cost> {
        if samples.is_empty() {
            return previous;
        }
        let n = samples.len() as f64;
        let mean_x = samples.iter().map(|(x, _)| *x as f64).sum::<f64>() / n;
        let mean_y = samples.iter().map(|(_, y)| y.as_secs_f64()).sum::<f64>() / n;
        let sxx: f64 = samples
            .iter()
            .map(|(x, _)| (*x as f64 - mean_x).powi(2))
            .sum();
        let sxy: f64 = samples
            .iter()
            .map(|(x, y)| (*x as f64 - mean_x) * (y.as_secs_f64() - mean_y))
            .sum();
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
        if sxx > 0.0 {
            let slope = sxy / sxx;
            let intercept = mean_y - slope * mean_x;
            if slope > 0.0 && intercept >= 0.0 {
                return Some(Cost {
                    fixed: secs(intercept),
                    per_text: secs(slope).max(Duration::from_nanos(1)),
                });
            }
            if slope > 0.0 {
                // Noise put the line below the origin: a call costs at least its texts.
                return Some(Cost {
                    fixed: Duration::ZERO,
                    per_text: secs(mean_y / mean_x.max(1.0)).max(Duration::from_nanos(1)),
                });
            }
        }
        let mean_x = mean_x.max(1.0);
        match previous {
            Some(prev) => {
                let expected = prev.of(mean_x.round() as u64).as_secs_f64();
                let scale = if expected > 0.0 {
                    mean_y / expected
                } else {
                    1.0
                };
                Some(Cost {
                    fixed: secs(prev.fixed.as_secs_f64() * scale),
                    per_text: secs(prev.per_text.as_secs_f64() * scale)
                        .max(Duration::from_nanos(1)),
                })
            }
            None => Some(Cost {
                fixed: Duration::ZERO,
                per_text: secs(mean_y / mean_x).max(Duration::from_nanos(1)),
            }),
        }
    }
}

impl Queue {
    /// How long a text admitted now would wait for its vector: what is left of the running call,
    /// then one full call for every full batch of texts queued ahead of it, then its own batch's
    /// call. `None` before any call was measured.
    fn expected_wait(&self, now: Instant, max_batch: u64) -> Option<Duration> {
        let cost = self.cost?;
        let max_batch = max_batch.max(1);
        let remaining = self.running.map_or(Duration::ZERO, |r| {
            cost.of(r.texts)
                .saturating_sub(now.saturating_duration_since(r.since))
        });
        let full_ahead = u32::try_from(self.waiting / max_batch).unwrap_or(u32::MAX);
        let own = self.waiting % max_batch + 1;
        Some(
            remaining
                .saturating_add(cost.of(max_batch).saturating_mul(full_ahead))
                .saturating_add(cost.of(own)),
        )
    }

    /// The admission rule for one deadline-bound text. A text whose call starts within the gathering
    /// window (no call running, room in the batch being gathered) is admitted unless its own call,
    /// at twice the estimate, would miss the deadline. Any other is admitted when its expected wait
    /// fits `budget` and, at twice the estimate (calls overrun under CPU contention), the deadline.
    /// Before the first measured call only the first case admits.
    fn admits(&self, now: Instant, max_batch: u64, budget: Duration, deadline: Duration) -> bool {
        let starts_now = self.running.is_none() && self.waiting < max_batch;
        let Some(wait) = self.expected_wait(now, max_batch) else {
            return starts_now;
        };
        if wait.saturating_mul(2) > deadline {
            return false;
        }
        starts_now || (!budget.is_zero() && wait <= budget)
    }
}

impl Counters {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Texts leave the queue unserved (expired, abandoned, or never sent).
    fn forget(&self, count: u64) {
        let mut queue = self.queue();
        queue.waiting = queue.waiting.saturating_sub(count);
        self.pending.fetch_sub(count, Ordering::Relaxed);
    }
}

/// The embed stage: a handle to the worker thread. Shared as `Arc<Embedder>`.
pub struct Embedder {
    /// `None` only during drop, so the worker sees the channel close before we join it.
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    dimension: usize,
    fingerprint: String,
    deadline: Duration,
    max_batch: usize,
    queue_budget: Duration,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("dimension", &self.dimension)
            .field("deadline", &self.deadline)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// Loads the model once (blocking; call at start-up, e.g. inside `spawn_blocking`).
    pub fn load(config: &EmbedConfig) -> Result<Embedder, EmbedError> {
        let started = Instant::now();
        let mut model = FastembedModel::load(config)?;
        let samples = calibrate(&mut model, config.max_batch);
        let cost = Cost::fit(&samples, None);
        tracing::info!(
            model_dir = %config.model_dir.display(),
            dimension = model.dimension(),
            threads = model.threads,
            load_ms = started.elapsed().as_millis() as u64,
            call_fixed_ms = cost.map_or(0.0, |c| c.fixed.as_secs_f64() * 1e3),
            call_per_text_ms = cost.map_or(0.0, |c| c.per_text.as_secs_f64() * 1e3),
            "embedding model loaded"
        );
        Embedder::start(Box::new(model), config, samples)
    }

    /// Starts the worker thread around any model; `model_dir` and `ort_lib` of `config` are unused.
    /// The model's cost is unknown until its first call (only an idle model admits texts until then).
    pub fn with_model(
        model: Box<dyn EmbedModel>,
        config: &EmbedConfig,
    ) -> Result<Embedder, EmbedError> {
        Embedder::start(model, config, VecDeque::new())
    }

    /// Starts the worker thread with the cost model fitted to `samples` (`(texts, took)` of calls
    /// made before it).
    fn start(
        model: Box<dyn EmbedModel>,
        config: &EmbedConfig,
        samples: VecDeque<(u64, Duration)>,
    ) -> Result<Embedder, EmbedError> {
        config.validate()?;
        let cost = Cost::fit(&samples, None);
        let (jobs, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let dimension = model.dimension();
        let fingerprint = model.fingerprint();
        let worker = Worker {
            model,
            jobs: rx,
            max_batch: config.max_batch,
            max_wait: config.max_wait,
            dimension,
            counters: Arc::clone(&counters),
            samples,
            cost,
            company: false,
        };
        counters.queue().cost = cost;
        let worker = std::thread::Builder::new()
            .name("reprise-embed".into())
            .spawn(move || worker.run())
            .map_err(|e| EmbedError::Load(format!("cannot start the embed thread: {e}")))?;
        Ok(Embedder {
            jobs: Some(jobs),
            worker: Some(worker),
            counters,
            dimension,
            fingerprint,
            deadline: config.deadline,
            max_batch: config.max_batch,
            queue_budget: config.queue_budget,
        })
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// What admission expects a model call to cost, as fitted to the last calls (`None` before
    /// the first).
    pub fn cost(&self) -> Option<Cost> {
        self.counters.queue().cost
    }

    /// The model's [`EmbedModel::fingerprint`].
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Embeds one text with dynamic micro-batching: concurrent callers are embedded together by the
    /// worker thread (never on tokio workers). Fails with `Timeout` when the deadline passes (the caller
    /// falls back to exact matching). Never panics. Needs a tokio runtime with timers enabled.
    pub async fn embed(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        if !self.reserve() {
            self.note_refusal();
            return self.count(Err(EmbedError::Overloaded));
        }
        let deadline = Instant::now() + self.deadline;
        let outcome = match self.send(vec![text.to_owned()], Some(deadline)) {
            Err(e) => Err(e),
            Ok(reply) => {
                match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), reply).await
                {
                    Err(_elapsed) => Err(EmbedError::Timeout),
                    Ok(Err(_worker_gone)) => Err(EmbedError::Closed),
                    Ok(Ok(reply)) => reply,
                }
            }
        };
        let outcome = outcome.and_then(|mut vectors| {
            vectors
                .pop()
                .ok_or_else(|| EmbedError::Failed("the model returned no vector".into()))
        });
        self.count(outcome)
    }

    /// Batch embedding for admin/warm-up paths (still through the worker thread), no deadline.
    ///
    /// Texts go in chunks of `max_batch`, one after the other, so live `embed` calls get a turn between
    /// chunks instead of queueing behind the whole list.
    pub async fn embed_many(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.counters
            .requests
            .fetch_add(texts.len() as u64, Ordering::Relaxed);
        let mut vectors = Vec::with_capacity(texts.len());
        let mut rest = texts;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(self.max_batch));
            let chunk = std::mem::replace(&mut rest, tail);
            let outcome = match self.submit(chunk) {
                Err(e) => Err(e),
                Ok(reply) => reply.await.unwrap_or(Err(EmbedError::Closed)),
            };
            vectors.extend(self.count(outcome)?);
        }
        Ok(vectors)
    }

    /// Takes a place in the next batch for one deadline-bound text, or refuses it, by
    /// [`Queue::admits`]. Issue 24: the rule before this one refused a text whenever a call was
    /// running and twice the average time per text (dominated by single calls) for every pending
    /// text exceeded a 5 ms budget, i.e. nearly always once calls overlapped: 87% of misses
    /// skipped matching at concurrency 8, where the model had ten times the capacity needed.
    fn reserve(&self) -> bool {
        let mut queue = self.counters.queue();
        let admitted = queue.admits(
            Instant::now(),
            self.max_batch as u64,
            self.queue_budget,
            self.deadline,
        );
        if admitted {
            queue.waiting += 1;
            self.counters.pending.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// Notes that a request wanted the model and could not have it (see [`Embedder::is_quiet`]).
    fn note_refusal(&self) {
        let epoch = *self.counters.epoch.get_or_init(Instant::now);
        let nanos = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters
            .refused_at_ns
            .store(nanos.max(1), Ordering::Relaxed);
    }

    /// Whether no request was refused a place for `period`: background work that takes the idle
    /// model right after a refusal would keep refusing requests call after call (none can queue
    /// behind it), so it waits for this to leave the next turn to them.
    pub fn is_quiet(&self, period: Duration) -> bool {
        let refused = self.counters.refused_at_ns.load(Ordering::Relaxed);
        let Some(epoch) = self.counters.epoch.get() else {
            return true;
        };
        refused == 0
            || epoch
                .elapsed()
                .saturating_sub(Duration::from_nanos(refused))
                >= period
    }

    /// Whether no text is queued or in the model: when background work may go in.
    pub fn is_idle(&self) -> bool {
        self.counters.pending.load(Ordering::Relaxed) == 0
    }

    /// Most texts one model call takes.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// Embeds `texts` (at most [`Embedder::max_batch`] makes one model call) without a deadline,
    /// blocking the calling thread: for background threads, never for a tokio worker.
    pub fn embed_blocking(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_background(texts)?.wait()
    }

    /// Queues `texts` (at most [`Embedder::max_batch`] makes one model call) without a deadline and
    /// returns at once: the caller can do other work (the backfill writes the previous batch's
    /// vectors) while the model runs, then [`Queued::wait`] for the vectors.
    pub fn embed_background(&self, texts: Vec<String>) -> Result<Queued, EmbedError> {
        self.counters
            .requests
            .fetch_add(texts.len() as u64, Ordering::Relaxed);
        match self.submit(texts) {
            Ok(reply) => Ok(Queued {
                reply,
                counters: Arc::clone(&self.counters),
            }),
            Err(e) => self.count(Err(e)),
        }
    }

    /// Sets the function told of every model call; only the first call takes effect.
    pub fn observe_batches(&self, observer: BatchObserver) {
        let _ = self.counters.observer.set(observer);
    }

    /// Sets the function told how long each deadline-bound text waited for its model call to
    /// start; only the first call takes effect.
    pub fn observe_queue_waits(&self, observer: WaitObserver) {
        let _ = self.counters.wait_observer.set(observer);
    }

    pub fn stats(&self) -> EmbedStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let cost = self.cost();
        EmbedStats {
            requests: get(&c.requests),
            batches: get(&c.batches),
            batched_items: get(&c.batched_items),
            timeouts: get(&c.timeouts),
            overloaded: get(&c.overloaded),
            pending: get(&c.pending),
            failures: get(&c.failures),
            max_batch_seen: get(&c.max_batch_seen),
            max_queue_wait_us: get(&c.max_queue_wait_us),
            call_fixed_ms: cost.map(|c| c.fixed.as_secs_f64() * 1e3),
            call_per_text_ms: cost.map(|c| c.per_text.as_secs_f64() * 1e3),
        }
    }

    /// Size and model time of the last model calls, oldest first.
    pub fn recent_batches(&self) -> Vec<BatchSample> {
        let recent = self
            .counters
            .recent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        recent.iter().copied().collect()
    }

    /// Queues work without a deadline (admin, warm-up, backfill): never refused.
    fn submit(&self, texts: Vec<String>) -> Result<oneshot::Receiver<Reply>, EmbedError> {
        let count = texts.len() as u64;
        self.counters.queue().waiting += count;
        self.counters.pending.fetch_add(count, Ordering::Relaxed);
        self.send(texts, None)
    }

    /// Sends a job whose texts are already counted in `pending` and the queue (by
    /// [`Embedder::reserve`] or [`Embedder::submit`]); takes them back out when the worker is gone.
    fn send(
        &self,
        texts: Vec<String>,
        deadline: Option<Instant>,
    ) -> Result<oneshot::Receiver<Reply>, EmbedError> {
        let (reply, rx) = oneshot::channel();
        let count = texts.len() as u64;
        let job = Job {
            texts,
            count,
            deadline,
            enqueued_at: Instant::now(),
            reply,
        };
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        if !sent {
            self.counters.forget(count);
            return Err(EmbedError::Closed);
        }
        Ok(rx)
    }

    /// Counts an outcome where the caller sees it, so each call is counted exactly once whether the
    /// worker or the caller's timer noticed the deadline.
    fn count<T>(&self, outcome: Result<T, EmbedError>) -> Result<T, EmbedError> {
        self.counters.count(outcome)
    }
}

impl Counters {
    fn count<T>(&self, outcome: Result<T, EmbedError>) -> Result<T, EmbedError> {
        match &outcome {
            Ok(_) | Err(EmbedError::Load(_)) => {}
            Err(EmbedError::Timeout) => {
                self.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            Err(EmbedError::Overloaded) => {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
            }
            Err(EmbedError::Failed(_) | EmbedError::Closed) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        outcome
    }
}

/// Background texts in the embed queue or the model: [`Embedder::embed_background`].
pub struct Queued {
    reply: oneshot::Receiver<Reply>,
    counters: Arc<Counters>,
}

impl Queued {
    /// Blocks the calling thread until the vectors come back: never call it on a tokio worker.
    pub fn wait(self) -> Result<Vec<Vec<f32>>, EmbedError> {
        let outcome = self
            .reply
            .blocking_recv()
            .unwrap_or(Err(EmbedError::Closed));
        self.counters.count(outcome)
    }
}

impl Drop for Embedder {
    /// Closes the channel and joins the worker. Blocks for at most the model call in progress: no
    /// caller can be waiting (they borrow `self`), so queued jobs are all abandoned and skipped.
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            if worker.join().is_err() {
                tracing::error!("embed worker thread panicked");
            }
        }
    }
}

/// The dedicated thread that owns the model.
struct Worker {
    model: Box<dyn EmbedModel>,
    jobs: Receiver<Job>,
    max_batch: usize,
    max_wait: Duration,
    dimension: usize,
    counters: Arc<Counters>,
    /// The last calls' `(texts, took)`, which [`Worker::cost`] is fitted to.
    samples: VecDeque<(u64, Duration)>,
    cost: Option<Cost>,
    /// Whether the last model call served more than one job: callers come together, so a batch
    /// is worth waiting `max_wait` for. False at start and after a call of one job.
    company: bool,
}

impl Worker {
    fn run(mut self) {
        // A job that would have overflowed the previous batch starts the next one.
        let mut carry = None;
        while let Some(batch) = self.gather(&mut carry) {
            self.serve(batch);
        }
    }

    /// Blocks for a first live job, then takes the jobs already queued behind it and, when the last
    /// call had [`Worker::company`], whatever else arrives until `max_batch` texts or `max_wait` after
    /// that first job was sent. Jobs already queued are taken even when the window has closed: that
    /// costs no waiting. `None` once every sender is gone.
    ///
    /// Issue 22: at concurrency 1 the window was pure delay: every lone text waited the whole
    /// `max_wait` (2 ms of a 7 ms call) for company that never came. Under load texts queue behind
    /// the running call anyway, so batches still form without it.
    fn gather(&self, carry: &mut Option<Job>) -> Option<Vec<Job>> {
        let first = loop {
            let job = match carry.take() {
                Some(job) => job,
                None => self.jobs.recv().ok()?,
            };
            if let Some(job) = admit(job, Instant::now(), &self.counters, Counted::Waiting) {
                break job;
            }
        };
        let window = if self.company {
            self.max_wait
        } else {
            Duration::ZERO
        };
        let window_end = first.enqueued_at + window;
        let mut items = first.texts.len();
        let mut batch = vec![first];
        while items < self.max_batch {
            let now = Instant::now();
            let next = if now < window_end {
                match self.jobs.recv_timeout(window_end - now) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            let Some(job) = admit(next, Instant::now(), &self.counters, Counted::Waiting) else {
                continue;
            };
            if items + job.texts.len() > self.max_batch {
                *carry = Some(job);
                break;
            }
            items += job.texts.len();
            batch.push(job);
        }
        // Close the batch under the queue lock. A text admitted after the channel looked empty is
        // counted as waiting but not here yet: it was admitted to this batch (the model was idle),
        // and it is on its way, so take it rather than make it wait for a whole model call.
        loop {
            {
                let mut queue = self.counters.queue();
                let room = items < self.max_batch && carry.is_none();
                if !room || queue.waiting <= items as u64 {
                    queue.waiting = queue.waiting.saturating_sub(items as u64);
                    queue.running = Some(Running {
                        since: Instant::now(),
                        texts: items as u64,
                    });
                    return Some(batch);
                }
            }
            let Ok(next) = self.jobs.recv() else {
                return Some(batch);
            };
            let Some(job) = admit(next, Instant::now(), &self.counters, Counted::Waiting) else {
                continue;
            };
            if items + job.texts.len() > self.max_batch {
                *carry = Some(job);
            } else {
                items += job.texts.len();
                batch.push(job);
            }
        }
    }

    /// Runs one model call for the live jobs of `batch` and answers each of them.
    fn serve(&mut self, batch: Vec<Job>) {
        // The gathering window may have let a deadline pass; check again right before the model.
        let now = Instant::now();
        let mut jobs: Vec<Job> = batch
            .into_iter()
            .filter_map(|j| admit(j, now, &self.counters, Counted::InBatch))
            .collect();
        if jobs.is_empty() {
            self.counters.queue().running = None;
            return;
        }
        let sizes: Vec<usize> = jobs.iter().map(|j| j.texts.len()).collect();
        // Several callers in one call: they come together, so the next batch waits for company.
        self.company = jobs.len() > 1;
        let texts: Vec<String> = jobs
            .iter_mut()
            .flat_map(|j| std::mem::take(&mut j.texts))
            .collect();

        let started = Instant::now();
        self.note_waits(&jobs, started);
        let result = match catch_unwind(AssertUnwindSafe(|| self.model.embed(&texts))) {
            Ok(result) => result.and_then(|v| check_output(v, texts.len(), self.dimension)),
            Err(panic) => Err(format!(
                "the model panicked: {}",
                panic_message(panic.as_ref())
            )),
        };
        // A failed or panicked call says nothing of the model's speed (unwinding and printing a
        // panic's backtrace can take longer than any call), so only a good one moves the estimate
        // admission works from: one slow failure must not refuse the texts after it.
        let cost = match result {
            Ok(_) => self.record(texts.len(), started.elapsed()),
            Err(_) => None,
        };
        {
            let mut queue = self.counters.queue();
            queue.running = None;
            if cost.is_some() {
                queue.cost = cost;
            }
        }
        // Answered below: these texts no longer hold anyone up.
        let answered: u64 = jobs.iter().map(|j| j.count).sum();
        self.counters.pending.fetch_sub(answered, Ordering::Relaxed);

        match result {
            Ok(vectors) => {
                let mut vectors = vectors.into_iter();
                for (job, size) in jobs.into_iter().zip(sizes) {
                    // A caller that gave up meanwhile just drops its receiver; nothing to do.
                    let _ = job.reply.send(Ok(vectors.by_ref().take(size).collect()));
                }
            }
            Err(message) => {
                tracing::warn!(size = texts.len(), error = %message, "embedding batch failed");
                for job in jobs {
                    let _ = job.reply.send(Err(EmbedError::Failed(message.clone())));
                }
            }
        }
    }

    /// Notes how long each deadline-bound text waited for its model call to start.
    fn note_waits(&self, jobs: &[Job], started: Instant) {
        let c = &self.counters;
        for job in jobs.iter().filter(|j| j.deadline.is_some()) {
            let waited = started.saturating_duration_since(job.enqueued_at);
            let micros = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
            c.max_queue_wait_us.fetch_max(micros, Ordering::Relaxed);
            if let Some(observe) = c.wait_observer.get() {
                observe(waited);
            }
        }
    }

    /// Counts a good model call and refits the cost model; returns the new fit.
    fn record(&mut self, size: usize, took: Duration) -> Option<Cost> {
        let c = &self.counters;
        if let Some(observe) = c.observer.get() {
            observe(size, took);
        }
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.batched_items.fetch_add(size as u64, Ordering::Relaxed);
        c.max_batch_seen.fetch_max(size as u64, Ordering::Relaxed);
        if self.samples.len() == FIT_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((size as u64, took));
        self.cost = Cost::fit(&self.samples, self.cost);
        let mut recent = c.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() == RECENT_BATCHES {
            recent.pop_front();
        }
        recent.push_back(BatchSample {
            size,
            millis: took.as_secs_f64() * 1e3,
        });
        self.cost
    }
}

/// Where a job's texts are counted when [`admit`] drops it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Counted {
    /// Still waiting for a batch (the queue's `waiting` counts them).
    Waiting,
    /// In a closed batch: only `pending` counts them.
    InBatch,
}

/// Keeps a job worth running: its caller still listens and its deadline has not passed. An expired job
/// is told `Timeout` (its caller counts it); an abandoned one is dropped silently.
fn admit(job: Job, now: Instant, counters: &Counters, counted: Counted) -> Option<Job> {
    let expired = job.deadline.is_some_and(|deadline| deadline <= now);
    if !(expired || job.reply.is_closed()) {
        return Some(job);
    }
    match counted {
        Counted::Waiting => counters.forget(job.count),
        Counted::InBatch => {
            counters.pending.fetch_sub(job.count, Ordering::Relaxed);
        }
    }
    if expired {
        let _ = job.reply.send(Err(EmbedError::Timeout));
    }
    None
}

/// Refuses a model answer that does not line up with the texts, rather than hand out wrong vectors.
fn check_output(
    vectors: Vec<Vec<f32>>,
    texts: usize,
    dimension: usize,
) -> Result<Vec<Vec<f32>>, String> {
    if vectors.len() != texts {
        return Err(format!(
            "the model returned {} vectors for {texts} texts",
            vectors.len()
        ));
    }
    if let Some(bad) = vectors.iter().find(|v| v.len() != dimension) {
        return Err(format!(
            "the model returned a vector of {} floats, expected {dimension}",
            bad.len()
        ));
    }
    Ok(vectors)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".to_owned()
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests spawn clients and servers beside the code under test; none of it must outlive the test"
)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::OnceLock;
    use tokio::task::JoinSet;

    /// A fake model: sleeps per batch, answers `[n; dim]` for text `"n"` so a test can check routing.
    struct Fake {
        sleep: Duration,
        fail: bool,
        dimension: usize,
        dropped: Arc<AtomicBool>,
    }

    impl Fake {
        fn new(sleep_ms: u64) -> Fake {
            Fake {
                sleep: Duration::from_millis(sleep_ms),
                fail: false,
                dimension: 4,
                dropped: Arc::new(AtomicBool::new(false)),
            }
        }
    }

    impl EmbedModel for Fake {
        fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(self.sleep);
            if self.fail {
                return Err("fake failure".into());
            }
            texts
                .iter()
                .map(|t| match t.as_str() {
                    "boom" => panic!("fake panic"),
                    "slow-fail" => {
                        std::thread::sleep(Duration::from_millis(2_000));
                        Err("fake failure, late".into())
                    }
                    // Holds the worker for a while without moving the cost estimate (a failed
                    // call does not): other jobs can queue behind it.
                    "hold" => {
                        std::thread::sleep(Duration::from_millis(300));
                        Err("held".into())
                    }
                    "short" => Ok(vec![0.0]),
                    t => Ok(vec![t.parse::<f32>().unwrap_or(-1.0); self.dimension]),
                })
                .collect()
        }

        fn dimension(&self) -> usize {
            self.dimension
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    fn config(deadline_ms: u64, max_wait_ms: u64) -> EmbedConfig {
        EmbedConfig {
            deadline: Duration::from_millis(deadline_ms),
            max_wait: Duration::from_millis(max_wait_ms),
            ..EmbedConfig::default()
        }
    }

    #[test]
    fn embedder_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Embedder>();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_batches_and_get_their_own_vectors() {
        // A lone caller's call starts at once, so the burst's first text runs alone and the rest
        // queue behind it: that needs a measured model (as `Embedder::load`'s calibration gives)
        // and a budget that covers the queue.
        let cfg = EmbedConfig {
            queue_budget: Duration::from_secs(10),
            ..config(10_000, 5)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(30)), &cfg).expect("start embedder"));
        embedder.embed("0").await.expect("measures the model");
        let mut calls = JoinSet::new();
        for n in 0..16 {
            let embedder = Arc::clone(&embedder);
            calls.spawn(async move { (n, embedder.embed(&n.to_string()).await) });
        }
        while let Some(joined) = calls.join_next().await {
            let (n, vector) = joined.expect("task");
            assert_eq!(vector.expect("embedding"), vec![n as f32; 4]);
        }
        let stats = embedder.stats();
        assert_eq!(stats.requests, 17);
        assert_eq!(stats.batched_items, 17);
        assert!(stats.batches < 17, "no batching: {stats:?}");
        assert!(stats.max_batch_seen > 1, "no batching: {stats:?}");
        assert_eq!(embedder.recent_batches().len() as u64, stats.batches);
    }

    #[tokio::test]
    async fn max_batch_caps_every_model_call() {
        let cfg = EmbedConfig {
            max_batch: 3,
            ..config(10_000, 50)
        };
        let embedder = Embedder::with_model(Box::new(Fake::new(1)), &cfg).expect("start embedder");
        let texts: Vec<String> = (0..10).map(|n| n.to_string()).collect();
        let vectors = embedder.embed_many(texts).await.expect("embeddings");
        let firsts: Vec<f32> = vectors.iter().map(|v| v[0]).collect();
        assert_eq!(firsts, (0..10).map(|n| n as f32).collect::<Vec<_>>());
        let sizes: Vec<usize> = embedder.recent_batches().iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![3, 3, 3, 1]);
        assert!(embedder
            .embed_many(Vec::new())
            .await
            .expect("empty")
            .is_empty());
    }

    #[tokio::test]
    async fn slow_model_times_out_and_expired_jobs_are_skipped() {
        // A model slower than the deadline, before any call measured it: the caller gives up.
        let embedder =
            Embedder::with_model(Box::new(Fake::new(200)), &config(50, 1)).expect("start embedder");
        let slow = embedder.embed("1").await;
        assert!(matches!(slow, Err(EmbedError::Timeout)), "{slow:?}");

        // A gathering window longer than the deadline (the last call had company, so the next batch
        // waits for some): both texts join the batch being gathered, and their deadlines pass
        // before it closes, so the model never runs them.
        let embedder = Arc::new(
            Embedder::with_model(Box::new(Fake::new(0)), &config(50, 150)).expect("start embedder"),
        );
        accompany(&embedder).await;
        let first = {
            let embedder = Arc::clone(&embedder);
            tokio::spawn(async move { embedder.embed("1").await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = embedder.embed("2").await;
        assert!(matches!(second, Err(EmbedError::Timeout)), "{second:?}");
        let first = first.await.expect("task");
        assert!(matches!(first, Err(EmbedError::Timeout)), "{first:?}");
        // No deadline: runs alone because both earlier jobs expired.
        embedder
            .embed_many(vec!["3".into()])
            .await
            .expect("no deadline");
        let stats = embedder.stats();
        assert_eq!(stats.timeouts, 2, "{stats:?}");
        // The company's call, then the third text's.
        assert_eq!(stats.batches, 2, "{stats:?}");
        assert_eq!(
            stats.batched_items, 3,
            "the expired jobs must not run: {stats:?}"
        );
    }

    /// Makes the worker's last call one with company (two callers' jobs), as under load, so that
    /// the next batch waits up to the window for more: a held call runs while two background jobs
    /// (never refused) queue behind it. The held call fails, so only the shared one is measured.
    async fn accompany(embedder: &Arc<Embedder>) {
        let background = |text: &str| {
            let (embedder, text) = (Arc::clone(embedder), text.to_owned());
            tokio::spawn(async move { embedder.embed_many(vec![text]).await })
        };
        let held = background("hold");
        until_running(embedder).await;
        let queued = [background("7"), background("8")];
        until_pending(embedder, 3).await;
        let held = held.await.expect("task");
        assert!(matches!(held, Err(EmbedError::Failed(_))), "{held:?}");
        for job in queued {
            job.await.expect("task").expect("served together");
        }
        let last = embedder.recent_batches().last().map(|b| b.size);
        assert_eq!(last, Some(2), "the two queued jobs shared one call");
    }

    /// Waits until `n` texts are pending (sent and not answered).
    async fn until_pending(embedder: &Embedder, n: u64) {
        for _ in 0..1000 {
            if embedder.stats().pending == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("pending never reached {n}: {:?}", embedder.stats());
    }

    /// Waits until a model call runs (gathering is over).
    async fn until_running(embedder: &Embedder) {
        for _ in 0..1000 {
            if embedder.counters.queue().running.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("no model call started: {:?}", embedder.stats());
    }

    /// Issue 14: a text admitted behind a running model call waited for that whole call (up to two
    /// batches, p99 186 ms against a 20 ms upstream). Now it is refused at once, however short the
    /// queue, and the running call's own text is still served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_text_arriving_while_a_batch_runs_is_refused_at_once() {
        let cfg = EmbedConfig {
            max_batch: 8,
            ..config(60_000, 1)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(300)), &cfg).expect("start"));
        // Measures the model: 300 ms a call.
        embedder.embed("0").await.expect("first call");
        assert!(
            embedder.is_quiet(Duration::from_secs(3600)),
            "nothing refused"
        );
        let running = {
            let embedder = Arc::clone(&embedder);
            tokio::spawn(async move { embedder.embed("1").await })
        };
        until_running(&embedder).await;
        for n in 2..10 {
            let refused = embedder.embed(&n.to_string()).await;
            assert!(
                matches!(refused, Err(EmbedError::Overloaded)),
                "{refused:?}"
            );
        }
        // Every refusal came back while the second model call was still running.
        let stats = embedder.stats();
        assert_eq!((stats.batches, stats.overloaded), (1, 8), "{stats:?}");
        // Background work now leaves the model's next turn to requests.
        assert!(!embedder.is_quiet(Duration::from_secs(3600)));
        assert_eq!(
            running.await.expect("task").expect("admitted while idle"),
            vec![1.0; 4]
        );
        // Idle again: admitted.
        assert_eq!(embedder.embed("7").await.expect("admitted"), vec![7.0; 4]);
        let stats = embedder.stats();
        assert_eq!((stats.pending, stats.timeouts), (0, 0), "{stats:?}");
    }

    /// With a queue budget that covers the running call (by the measured time per text), a text
    /// arriving meanwhile queues behind it and is served by the next call instead of being refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_budget_that_covers_the_running_call_lets_a_text_queue_behind_it() {
        let cfg = EmbedConfig {
            max_batch: 8,
            queue_budget: Duration::from_secs(30),
            ..config(60_000, 1)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(300)), &cfg).expect("start"));
        // Measures the model: 300 ms a call.
        embedder.embed("0").await.expect("first call");
        let running = {
            let embedder = Arc::clone(&embedder);
            tokio::spawn(async move { embedder.embed("1").await })
        };
        until_running(&embedder).await;
        assert_eq!(embedder.embed("2").await.expect("queued"), vec![2.0; 4]);
        assert_eq!(running.await.expect("task").expect("first"), vec![1.0; 4]);
        let stats = embedder.stats();
        assert_eq!((stats.overloaded, stats.timeouts), (0, 0), "{stats:?}");
        assert_eq!(stats.batches, 3, "{stats:?}");
    }

    /// Issue 22: a lone text waited the whole gathering window for company before its call started
    /// (2 ms of a 7 ms call at concurrency 1). With a window far longer than the deadline, the texts
    /// of one caller at a time are answered (before, each timed out waiting for the window to close).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_caller_does_not_wait_for_company() {
        let embedder =
            Embedder::with_model(Box::new(Fake::new(0)), &config(2_000, 600_000)).expect("start");
        for n in 1..=3u64 {
            let vector = embedder.embed(&n.to_string()).await;
            assert_eq!(vector.expect("answered without waiting"), vec![n as f32; 4]);
        }
        let sizes: Vec<usize> = embedder.recent_batches().iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![1, 1, 1]);
        assert_eq!(embedder.stats().timeouts, 0);
    }

    /// Texts that queue behind a running call share the next call without any window; once calls
    /// have company, a lone arrival waits for the next caller (up to the window) instead of
    /// running alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_that_come_together_are_batched_and_then_wait_for_company() {
        let cfg = EmbedConfig {
            max_batch: 2,
            queue_budget: Duration::from_secs(30),
            ..config(20_000, 600_000)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(200)), &cfg).expect("start"));
        // Alone: starts at once (and measures the model, so texts may queue behind a call).
        embedder.embed("0").await.expect("first call");
        let spawn = |n: u64| {
            let embedder = Arc::clone(&embedder);
            tokio::spawn(async move { (n, embedder.embed(&n.to_string()).await) })
        };
        let first = spawn(1);
        until_running(&embedder).await;
        // Queued behind the running call: they share the next one.
        let queued = [spawn(2), spawn(3)];
        until_pending(&embedder, 3).await;
        for call in [first].into_iter().chain(queued) {
            let (n, vector) = call.await.expect("task");
            assert_eq!(vector.expect("served"), vec![n as f32; 4]);
        }
        // The last call had company: a lone arrival now waits for the next caller.
        let alone = spawn(4);
        until_pending(&embedder, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(embedder.stats().batches, 3, "the fourth text ran alone");
        let second = spawn(5);
        for call in [alone, second] {
            let (n, vector) = call.await.expect("task");
            assert_eq!(vector.expect("served"), vec![n as f32; 4]);
        }
        let sizes: Vec<usize> = embedder.recent_batches().iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![1, 1, 2, 2]);
    }

    /// A model whose call costs `fixed + per_text × n`, like a real one (the plain fake costs the
    /// same whatever the batch).
    struct Batching {
        fixed: Duration,
        per_text: Duration,
    }

    impl EmbedModel for Batching {
        fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(self.fixed + self.per_text * texts.len() as u32);
            Ok(texts.iter().map(|_| vec![1.0; 4]).collect())
        }

        fn dimension(&self) -> usize {
            4
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Issue 24: at the defaults, 87% of misses skipped matching at concurrency 8 although the model
    /// had ten times the capacity needed: any text arriving while a call ran was refused. Here 8
    /// callers, each pausing a few ms between texts (their upstream, so that they do not move in
    /// lockstep), keep the model busy, each call absorbing the texts that arrived during the one
    /// before (the model keeps up): none is refused, none is late.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_the_model_keeps_up_with_are_never_refused_at_the_defaults() {
        let model = Batching {
            fixed: ms(10),
            per_text: ms(1),
        };
        let embedder = Arc::new(
            Embedder::with_model(Box::new(model), &EmbedConfig::default()).expect("start"),
        );
        // What the real model's calibration does at load: one call alone, one full batch.
        embedder.embed_many(vec!["a".into()]).await.expect("alone");
        let batch: Vec<String> = (0..8).map(|n| n.to_string()).collect();
        embedder.embed_many(batch).await.expect("batch");
        let mut callers = JoinSet::new();
        for caller in 0..8u64 {
            let embedder = Arc::clone(&embedder);
            callers.spawn(async move {
                for n in 0..25u64 {
                    tokio::time::sleep(ms((caller * 5 + n * 3) % 11)).await;
                    embedder
                        .embed(&format!("{caller}-{n}"))
                        .await
                        .map_err(|e| format!("caller {caller}, text {n}: {e}"))?;
                }
                Ok::<_, String>(())
            });
        }
        while let Some(joined) = callers.join_next().await {
            joined
                .expect("task")
                .expect("every text admitted and served");
        }
        let stats = embedder.stats();
        assert_eq!((stats.overloaded, stats.timeouts), (0, 0), "{stats:?}");
        assert!(
            stats.max_batch_seen > 1,
            "the callers overlapped: {stats:?}"
        );
    }

    #[test]
    fn the_cost_model_separates_a_call_from_its_texts() {
        // all-MiniLM-L6-v2 on 2 cores (criterion, 2026-11-30): 7.6 ms alone, 93 ms for 32.
        let samples: VecDeque<(u64, Duration)> = [(1, 7_600), (32, 93_000), (1, 7_600)]
            .into_iter()
            .map(|(n, us)| (n, Duration::from_micros(us)))
            .collect();
        let cost = Cost::fit(&samples, None).expect("fitted");
        let near = |d: Duration, us: u64| d.as_micros().abs_diff(u128::from(us)) < 50;
        assert!(near(cost.fixed, 4_845), "{cost:?}");
        assert!(near(cost.per_text, 2_755), "{cost:?}");
        assert!(near(cost.of(16), 4_845 + 16 * 2_755), "{cost:?}");

        // Calls of one size only: the last fit's shape, scaled to what they took.
        let busier: VecDeque<(u64, Duration)> = [(1, ms(15)), (1, ms(15))].into_iter().collect();
        let scaled = Cost::fit(&busier, Some(cost)).expect("scaled");
        assert!(near(scaled.of(1), 15_000), "{scaled:?}");
        assert!(near(scaled.of(32), 93_000 * 15_000 / 7_600), "{scaled:?}");
        // And with no shape to keep, the whole time is per text.
        let alone = Cost::fit(&busier, None).expect("proportional");
        assert_eq!((alone.fixed, alone.per_text), (Duration::ZERO, ms(15)));
        assert_eq!(Cost::fit(&VecDeque::new(), None), None);
    }

    #[test]
    fn admission_refuses_only_when_the_expected_wait_exceeds_the_budget() {
        let now = Instant::now();
        let cost = Cost {
            fixed: ms(5),
            per_text: ms(3),
        };
        let queue = |running: Option<u64>, waiting: u64| Queue {
            waiting,
            running: running.map(|texts| Running { since: now, texts }),
            cost: Some(cost),
        };
        let (budget, deadline, batch) = (ms(100), ms(250), 16);
        // A full batch just started (53 ms), 10 texts gathered for the next: an 11th waits for the
        // rest of the call and its own batch of 11 (38 ms), 91 ms.
        let q = queue(Some(16), 10);
        assert_eq!(q.expected_wait(now, batch), Some(ms(91)));
        assert!(q.admits(now, batch, budget, deadline));
        // Half-way through that call, the wait is 26.5 ms shorter.
        let later = now + Duration::from_micros(26_500);
        assert_eq!(
            q.expected_wait(later, batch),
            Some(Duration::from_micros(64_500))
        );
        // A full batch queued behind the running one: the next text waits for both, 114 ms.
        let q = queue(Some(16), 16);
        assert_eq!(q.expected_wait(now, batch), Some(ms(114)));
        assert!(!q.admits(now, batch, budget, deadline));
        assert!(q.admits(now, batch, ms(120), deadline));
        // ... unless twice that would miss the deadline.
        assert!(!q.admits(now, batch, ms(120), ms(200)));
        // Idle with room: the call starts within the gathering window, whatever the budget.
        assert!(queue(None, 3).admits(now, batch, Duration::ZERO, deadline));
        // A zero budget admits nothing behind a running call.
        assert!(!queue(Some(1), 0).admits(now, batch, Duration::ZERO, deadline));
        // Before any call was measured, only the idle model admits.
        let unmeasured = Queue {
            running: Some(Running {
                since: now,
                texts: 1,
            }),
            ..Queue::default()
        };
        assert!(!unmeasured.admits(now, batch, budget, deadline));
        assert!(Queue::default().admits(now, batch, budget, deadline));
    }

    /// Texts arriving while the model is idle are admitted together into the batch being gathered,
    /// up to `max_batch`; none of them waits for another model call to end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn texts_arriving_while_idle_share_the_batch_being_gathered() {
        // A window long enough that all four arrive within it even on a loaded machine.
        let cfg = EmbedConfig {
            max_batch: 4,
            ..config(60_000, 1_000)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(300)), &cfg).expect("start"));
        // Under load: the window is open (a lone caller would not wait for the others).
        accompany(&embedder).await;
        let mut calls = JoinSet::new();
        for n in 1..=4u64 {
            let caller = Arc::clone(&embedder);
            calls.spawn(async move { (n, caller.embed(&n.to_string()).await) });
            // One at a time, so the order (and which ones fit) is fixed.
            until_pending(&embedder, n).await;
        }
        // The batch is full: a fifth text would wait for a whole call, so it is refused.
        let refused = embedder.embed("5").await;
        assert!(
            matches!(refused, Err(EmbedError::Overloaded)),
            "{refused:?}"
        );
        while let Some(joined) = calls.join_next().await {
            let (n, vector) = joined.expect("task");
            assert_eq!(vector.expect("admitted"), vec![n as f32; 4]);
        }
        let sizes: Vec<usize> = embedder.recent_batches().iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![2, 4], "the four shared one call");
        // The gathering, closed as soon as the batch filled, is all they waited for.
        let waited = embedder.stats().max_queue_wait_us;
        assert!(waited > 0 && waited < 1_000_000, "waited {waited} us");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_the_measured_model_time_says_would_be_late_is_refused() {
        let cfg = EmbedConfig {
            max_batch: 8,
            ..config(250, 0)
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Fake::new(150)), &cfg).expect("start"));
        // Measures the model: about 150 ms a text alone. Twice the estimate must fit in 250 ms:
        // even with the model idle it does not.
        embedder.embed("1").await.expect("first call");
        let refused = embedder.embed("2").await;
        assert!(
            matches!(refused, Err(EmbedError::Overloaded)),
            "{refused:?}"
        );
        assert_eq!(embedder.stats().timeouts, 0);
        assert_eq!(embedder.stats().batches, 1);
    }

    #[test]
    fn embed_blocking_serves_background_threads() {
        let embedder = Embedder::with_model(Box::new(Fake::new(0)), &config(1_000, 0))
            .expect("start embedder");
        assert!(embedder.is_idle());
        let vectors = embedder
            .embed_blocking(vec!["1".into(), "2".into()])
            .expect("vectors");
        assert_eq!(vectors, vec![vec![1.0; 4], vec![2.0; 4]]);
        assert!(embedder.is_idle());
    }

    #[test]
    fn admit_answers_an_expired_job_with_timeout() {
        let (reply, mut rx) = oneshot::channel();
        let now = Instant::now();
        let job = Job {
            texts: vec!["1".into()],
            count: 1,
            deadline: Some(now),
            enqueued_at: now,
            reply,
        };
        let counters = Counters::default();
        counters.pending.store(1, Ordering::Relaxed);
        assert!(admit(job, now, &counters, Counted::Waiting).is_none());
        assert!(matches!(rx.try_recv(), Ok(Err(EmbedError::Timeout))));
        assert_eq!(counters.pending.load(Ordering::Relaxed), 0);
    }

    /// Under load a panicking call took long enough (the backtrace) to make the time estimate refuse
    /// the next text as `Overloaded`: a failed call must not move the estimate. A late error stands
    /// for it here (a panic's own backtrace time is what made the first version of this test late).
    #[tokio::test]
    async fn a_slow_failed_call_does_not_refuse_the_texts_after_it() {
        // Before the fix, the failed call's 2 s became the estimate, and the next text's own call,
        // at twice the estimate, no longer fit the 3 s deadline.
        let embedder =
            Embedder::with_model(Box::new(Fake::new(0)), &config(3_000, 0)).expect("start");
        let result = embedder.embed("slow-fail").await;
        assert!(matches!(result, Err(EmbedError::Failed(_))), "{result:?}");
        assert_eq!(
            embedder
                .embed("3")
                .await
                .expect("admitted after the failure"),
            vec![3.0; 4]
        );
    }

    #[tokio::test]
    async fn model_errors_and_panics_fail_the_call_but_not_the_worker() {
        let mut failing = Fake::new(0);
        failing.fail = true;
        let embedder = Embedder::with_model(Box::new(failing), &config(1_000, 0)).expect("start");
        let result = embedder.embed("1").await;
        assert!(
            matches!(&result, Err(EmbedError::Failed(m)) if m.contains("fake failure")),
            "{result:?}"
        );
        assert_eq!(embedder.stats().failures, 1);

        let embedder =
            Embedder::with_model(Box::new(Fake::new(0)), &config(1_000, 0)).expect("start");
        let result = embedder.embed("boom").await;
        assert!(matches!(result, Err(EmbedError::Failed(_))), "{result:?}");
        let result = embedder.embed("short").await;
        assert!(matches!(result, Err(EmbedError::Failed(_))), "{result:?}");
        assert_eq!(
            embedder.embed("7").await.expect("worker survives"),
            vec![7.0; 4]
        );
        assert_eq!(embedder.stats().failures, 2);
    }

    #[test]
    fn drop_stops_the_worker_and_releases_the_model() {
        let fake = Fake::new(0);
        let dropped = Arc::clone(&fake.dropped);
        let embedder = Embedder::with_model(Box::new(fake), &config(1_000, 0)).expect("start");
        drop(embedder);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn a_model_run_one_text_at_a_time_gets_one_thread_unless_told() {
        assert_eq!(default_threads(true), 1);
        assert_eq!(default_threads(false), crate::priority::cores());
        assert_eq!(EmbedConfig::default().threads, None);
        let zero = EmbedConfig {
            threads: Some(0),
            ..EmbedConfig::default()
        };
        assert!(zero.validate().is_err());
    }

    #[test]
    fn config_and_spec_errors_name_the_field_or_file() {
        let bad = EmbedConfig {
            max_batch: 0,
            ..EmbedConfig::default()
        };
        let err = Embedder::with_model(Box::new(Fake::new(0)), &bad).expect_err("max_batch 0");
        assert!(err.to_string().contains("max_batch"), "{err}");

        let dir = tempfile::tempdir().expect("tempdir");
        let err = ModelSpec::read(dir.path()).expect_err("no spec file");
        assert!(err.to_string().contains(MODEL_SPEC_FILE), "{err}");

        let spec = "dimension = 384\npooling = \"max\"\nnormalize = true\nmax_length = 256\n";
        std::fs::write(dir.path().join(MODEL_SPEC_FILE), spec).expect("write spec");
        let err = ModelSpec::read(dir.path()).expect_err("bad pooling");
        assert!(err.to_string().contains("pooling"), "{err}");

        let err = Embedder::load(&EmbedConfig {
            model_dir: dir.path().join("missing"),
            ..EmbedConfig::default()
        })
        .expect_err("no model dir");
        assert!(matches!(err, EmbedError::Load(_)), "{err}");
    }

    // ---- real model ----

    /// `(model_dir, ort_lib)`, or `None` to skip. On CI missing files fail the test instead.
    fn real_paths() -> Option<(PathBuf, PathBuf)> {
        let root = std::env::var_os("REPRISE_MODELS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")));
        let model_dir = root.join("all-MiniLM-L6-v2");
        let ort_lib = root
            .join("onnxruntime")
            .join(default_paths().1.file_name()?);
        let present = model_dir.join("model.onnx").is_file()
            && model_dir.join(MODEL_SPEC_FILE).is_file()
            && ort_lib.is_file();
        if present {
            return Some((model_dir, ort_lib));
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "model files missing under {}: run scripts/provision-models.sh",
            root.display()
        );
        eprintln!(
            "skipping: model files missing under {} (run scripts/provision-models.sh)",
            root.display()
        );
        None
    }

    /// One real embedder for all tests in this binary: loading takes a while and tests run in parallel.
    /// The deadline is generous because debug builds tokenize slowly and tests share two cores.
    fn real_embedder() -> Option<Arc<Embedder>> {
        static REAL: OnceLock<Arc<Embedder>> = OnceLock::new();
        let (model_dir, ort_lib) = real_paths()?;
        Some(Arc::clone(REAL.get_or_init(|| {
            // Shared by tests that run in parallel: one's text may queue behind another's call
            // (the default budget of a few ms refuses it as Overloaded on a busy machine).
            let config = EmbedConfig {
                model_dir,
                ort_lib,
                deadline: Duration::from_secs(30),
                queue_budget: Duration::from_secs(30),
                ..EmbedConfig::default()
            };
            Arc::new(Embedder::load(&config).expect("load the real model"))
        })))
    }

    async fn real() -> Option<Arc<Embedder>> {
        tokio::task::spawn_blocking(real_embedder)
            .await
            .expect("load task")
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (norm(a) * norm(b))
    }

    #[tokio::test]
    async fn real_model_gives_unit_vectors_that_rank_paraphrases_close() {
        let Some(embedder) = real().await else { return };
        assert_eq!(embedder.dimension(), 384);
        // Loading it turned off the tokenizer's hand-off to rayon (see `load_inner`).
        assert!(!tokenizers::utils::parallelism::get_parallelism());
        let reset = embedder
            .embed("how do I reset my password")
            .await
            .expect("embed");
        let forgot = embedder
            .embed("I forgot my password, how can I reset it")
            .await
            .expect("embed");
        let france = embedder
            .embed("what is the capital of France")
            .await
            .expect("embed");
        for v in [&reset, &forgot, &france] {
            assert_eq!(v.len(), 384);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
        }
        let close = cosine(&reset, &forgot);
        let far = cosine(&reset, &france);
        eprintln!("cosine paraphrase = {close:.4}, unrelated = {far:.4}");
        assert!(close > 0.8, "paraphrase cosine {close}");
        assert!(far < 0.3, "unrelated cosine {far}");
    }

    /// A prompt far past what the model reads is tokenized from its first part only, and its
    /// vector is the one of any text that shares that part: the model reads 256 tokens of each.
    #[tokio::test]
    async fn real_model_reads_a_huge_prompt_from_its_first_part() {
        let Some(embedder) = real().await else { return };
        let question = "How do I rotate the signing keys of our staging cluster?";
        let past_the_model = format!("{question}{}", " and then some more words".repeat(120));
        let huge = format!("{past_the_model}{}", " filler".repeat(400_000));
        assert!(huge.len() > 2 * 1024 * 1024 && past_the_model.len() < tokenized_bytes(256));
        let read = embedder.embed(&past_the_model).await.expect("embed");
        let cut = embedder.embed(&huge).await.expect("embed a 2.8 MB prompt");
        assert!(cosine(&read, &cut) > 0.999_999, "{}", cosine(&read, &cut));
    }

    #[test]
    fn a_text_is_cut_for_the_tokenizer_at_a_character_boundary() {
        assert_eq!(tokenized_bytes(256), TOKENIZED_BYTES);
        assert_eq!(tokenized_bytes(8_192), 2 * 1024 * 1024);
        let limit = tokenized_bytes(256);
        let short = "a question";
        assert_eq!(tokenized_part(short, limit), short);
        // Three bytes a character: the cut falls inside one, and moves back to its start.
        let wide = "€".repeat(limit);
        let cut = tokenized_part(&wide, limit);
        assert!(cut.len() <= limit && cut.len() > limit - 3);
        assert!(wide.starts_with(cut));
        assert_eq!(cut.chars().count() * 3, cut.len());
    }

    #[tokio::test]
    async fn real_model_gives_the_same_vector_alone_and_in_a_padded_batch() {
        let Some(embedder) = real().await else { return };
        let text = "how do I reset my password";
        let alone = embedder.embed(text).await.expect("embed");
        // Texts of different lengths, so the batch is padded around our text.
        let mut batch: Vec<String> = vec![
            "hi".into(),
            "a much longer sentence about the weather in the mountains this weekend".into(),
            "what is the capital of France".into(),
            text.into(),
            "x".into(),
            "translate 'good morning' into German, Spanish and Italian please".into(),
            "".into(),
            "rust async channels".into(),
        ];
        let position = 3;
        let vectors = embedder
            .embed_many(std::mem::take(&mut batch))
            .await
            .expect("batch");
        assert_eq!(vectors.len(), 8);
        let diff = alone
            .iter()
            .zip(&vectors[position])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("max abs diff alone vs batch of 8 = {diff:e}");
        assert!(diff < 1e-4, "max abs diff {diff}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real_model_serves_concurrent_callers() {
        let Some(embedder) = real().await else { return };
        let texts: Vec<String> = (0..12).map(|n| format!("question number {n}")).collect();
        let expected = embedder.embed_many(texts.clone()).await.expect("batch");
        let mut calls = JoinSet::new();
        for (n, text) in texts.into_iter().enumerate() {
            let embedder = Arc::clone(&embedder);
            calls.spawn(async move {
                // A caller that arrives while a model call runs is refused (it would fall back to
                // exact matching); here it asks again until its turn comes.
                loop {
                    match embedder.embed(&text).await {
                        Err(EmbedError::Overloaded) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        other => return (n, other),
                    }
                }
            });
        }
        while let Some(joined) = calls.join_next().await {
            let (n, vector) = joined.expect("task");
            let vector = vector.expect("embed");
            assert!(
                cosine(&vector, &expected[n]) > 0.9999,
                "text {n} got another vector"
            );
        }
    }
}
