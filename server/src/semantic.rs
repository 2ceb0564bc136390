//! Semantic matching, the stage after an exact miss: embed the final user turn with the local model,
//! search the request's partition in the vector index, and serve the best live entry whose
//! similarity clears the threshold and whose prompt passes the literal [`guard`](crate::guard)s.
//!
//! It fails open: a late or failed embedding, an overloaded embedding queue, or a missing model turns
//! the request into an exact-only lookup, counted by reason and logged, never an error for the client.
//! The answer is stored without a vector then, and the [`backfill`](crate::backfill) embeds it later.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backfill::{wants_vector, Backfill};
use crate::config::Config;
use crate::embed::{EmbedConfig, EmbedError, Embedder};
use crate::entry::{Entry, EntryId, Replay};
use crate::guard::{Guard, Guards, Literals};
use crate::index::{Graphs, HnswIndex, IndexConfig, IndexError, ScansBusy, VectorIndex};
use crate::lock::lock;
use crate::reembed;
use crate::store::{Store, StoreError};
use crate::timing::unix_ms;

/// How many neighbours a lookup considers: the best may be a tombstone the index has not seen yet.
const CANDIDATES: usize = 4;

/// The embedder and the index, present only when the model loaded.
pub struct Semantic {
    pub embedder: Arc<Embedder>,
    pub index: Arc<SwappableIndex>,
    index_dir: PathBuf,
    /// Requests that fell back to exact matching, all reasons together.
    pub fallbacks: AtomicU64,
    /// What the guards read from recent candidates' prompts (0.1–0.2 ms per 2 KB prompt).
    candidates: CandidateLiterals,
    /// The same requests by reason.
    fallback_reasons: [AtomicU64; FallbackReason::ALL.len()],
    /// When the last warning of a flood (overload, busy scans) was logged, by reason (ms since the
    /// epoch): one line per interval.
    flood_warned_ms: [AtomicU64; FallbackReason::ALL.len()],
    /// Embeds the entries stored without a vector.
    pub backfill: Arc<Backfill>,
    /// Closing this stops the maintenance thread.
    stop_tx: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    maintenance: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// How many candidates' literals are remembered: the entries that searches keep meeting.
const CANDIDATE_LITERALS: usize = 4096;

/// The guards' reading of candidates' prompts, by entry id. An entry's prompt never changes, but
/// an id can name another entry after a flush or a store moved aside, so the prompt's hash is
/// kept with it and checked.
struct CandidateLiterals(Mutex<lru::LruCache<u64, (blake3::Hash, Arc<Literals>)>>);

impl Default for CandidateLiterals {
    fn default() -> Self {
        Self(Mutex::new(lru::LruCache::new(
            std::num::NonZeroUsize::new(CANDIDATE_LITERALS).unwrap_or(std::num::NonZeroUsize::MIN),
        )))
    }
}

impl CandidateLiterals {
    fn of(&self, entry: &Entry) -> Arc<Literals> {
        let prompt = &entry.summary.prompt;
        let hash = blake3::hash(prompt.as_bytes());
        let cached = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&entry.id.0)
            .filter(|(h, _)| *h == hash)
            .map(|(_, literals)| literals.clone());
        cached.unwrap_or_else(|| {
            // Read outside the lock: concurrent lookups never wait on each other's reading.
            let literals = Arc::new(Literals::of(prompt));
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .put(entry.id.0, (hash, literals.clone()));
            literals
        })
    }
}

/// Why a request fell back to exact matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// Refused at once: the embedding queue could not meet the deadline.
    Overload,
    /// Queued, but the deadline passed first.
    Deadline,
    /// The model failed or its thread stopped.
    Failed,
    /// Embedded, but the partition is still scanned exactly while its graph is built (after a
    /// rebuild from the store) and every core already runs such a scan.
    ScanBusy,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 4] =
        [Self::Overload, Self::Deadline, Self::Failed, Self::ScanBusy];

    pub fn name(self) -> &'static str {
        match self {
            Self::Overload => "overload",
            Self::Deadline => "deadline",
            Self::Failed => "failed",
            Self::ScanBusy => "scan_busy",
        }
    }

    fn of(err: &EmbedError) -> Self {
        match err {
            EmbedError::Overloaded => Self::Overload,
            EmbedError::Timeout => Self::Deadline,
            EmbedError::Load(_) | EmbedError::Failed(_) | EmbedError::Closed => Self::Failed,
        }
    }
}

/// Fallbacks by reason, for `/admin/stats`, `/healthz` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Fallbacks {
    pub overload: u64,
    pub deadline: u64,
    pub failed: u64,
    pub scan_busy: u64,
}

impl Fallbacks {
    /// By reason, as `/metrics` labels them.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            (FallbackReason::Overload.name(), self.overload),
            (FallbackReason::Deadline.name(), self.deadline),
            (FallbackReason::Failed.name(), self.failed),
            (FallbackReason::ScanBusy.name(), self.scan_busy),
        ]
    }
}

/// At most one warning of a flood (overload, busy scans) per this many milliseconds: under load
/// every miss would log one.
const FLOOD_WARN_EVERY_MS: u64 = 10_000;

/// What one search looks for.
#[derive(Debug, Clone)]
pub struct Query {
    pub partition: [u8; 32],
    pub prompt: String,
    pub threshold: f32,
    /// The similarity the request is served at (`threshold` is lower when a judge decides
    /// between the two): a graph search that found nothing as near is rechecked by the index.
    pub serve_at: f32,
    pub guards: Guards,
    pub max_age_s: Option<u64>,
}

/// An entry a search will serve.
pub struct Hit {
    /// Its cold half (`events` empty, `body` null): what the search decided on.
    pub entry: Entry,
    pub similarity: f32,
    /// What the hit sends, read as an exact hit reads it.
    pub replay: Arc<Replay>,
}

/// What one search found (see [`Outcome`]).
#[derive(Default)]
struct Found {
    hit: Option<Hit>,
    nearest: Option<f32>,
    nearest_entry: Option<EntryId>,
    nearest_guard: Option<Guard>,
    refused: Option<Guard>,
    skipped: Option<FallbackReason>,
}

/// Whether semantic matching runs, and why not when it does not (for logs and `/healthz`).
pub enum Status {
    Ready(Arc<Semantic>),
    Disabled(String),
}

/// What the semantic stage found for one request.
#[derive(Default)]
pub struct Outcome {
    /// A live entry of the partition at or above the threshold, with its similarity and replay.
    pub hit: Option<Hit>,
    /// Similarity of the best candidate in the partition (`x-reprise-nearest`).
    pub nearest: Option<f32>,
    /// That candidate (feedback can approve a near miss).
    pub nearest_entry: Option<EntryId>,
    /// The guard that refuses the best candidate, whatever its similarity
    /// (`x-reprise-nearest-guard`): a lower threshold would not serve it either. Not a refusal.
    pub nearest_guard: Option<Guard>,
    /// The guard that refused a candidate at or above the threshold when no other was served: a
    /// wrong answer not given (`x-reprise-guard`, counted in `guard_refusals`).
    pub refused: Option<Guard>,
    /// Why the index was not searched although the query was embedded (busy exact scans).
    pub skipped: Option<FallbackReason>,
    pub search_ms: Option<f64>,
}

impl Semantic {
    /// Loads the model and the index (from its dump in the data dir when it matches the store,
    /// otherwise rebuilt from the vectors stored with the entries).
    ///
    /// `embedder` replaces the configured model when given (tests drive the stage with a fake);
    /// `preload` is the dump's load started before the store opened, if any.
    pub fn start(
        config: &Config,
        store: &Arc<dyn Store>,
        embedder: Option<Arc<Embedder>>,
        preload: Option<DumpPreload>,
    ) -> Status {
        if !config.semantic {
            return Status::Disabled("semantic matching is turned off (semantic = false)".into());
        }
        if let Some(embedder) = embedder {
            return Self::around(embedder, config, store, preload);
        }
        let embed_config = EmbedConfig {
            model_dir: config.model_dir.clone(),
            ort_lib: config.ort_lib.clone(),
            deadline: Duration::from_millis(config.embed_deadline_ms),
            max_batch: config.embed_max_batch,
            max_wait: Duration::from_millis(config.embed_max_wait_ms),
            queue_budget: Duration::from_millis(config.embed_queue_budget_ms),
            threads: config.embed_threads,
        };
        let embedder = match Embedder::load(&embed_config) {
            Ok(e) => Arc::new(e),
            Err(err) => {
                return Status::Disabled(format!(
                    "the embedding model could not be loaded from {} (ORT library {}): {err}. Run scripts/provision-models.sh or set --model-dir/--ort-lib",
                    config.model_dir.display(),
                    config.ort_lib.display()
                ))
            }
        };
        Self::around(embedder, config, store, preload)
    }

    /// The stage around a loaded embedder: the index, its maintenance and the backfill. A local
    /// store whose vectors are another model's starts with an empty index and is re-embedded
    /// (a shared store's model is checked by the state, against the other replicas').
    fn around(
        embedder: Arc<Embedder>,
        config: &Config,
        store: &Arc<dyn Store>,
        preload: Option<DumpPreload>,
    ) -> Status {
        let index_dir = config.data_dir.join("index");
        // Joined before the plan may delete the dump (a change of model): `hnsw_rs` maps a graph's
        // data file by path while it loads, and exits the process when the file is gone. By now
        // it is done or nearly: it only runs beside a store open that scans every entry.
        let preloaded = preload.map(DumpPreload::join);
        let plan = match store.feed() {
            Some(_) => Ok(reembed::Plan::Load),
            // A store degraded at start reads as empty: that must not pass for a store without vectors.
            None => reembed::plan(&config.data_dir, embedder.fingerprint(), || {
                let ids = stored_ids(store.as_ref(), PATIENCE).map_err(|e| e.to_string())?;
                match store.degraded() {
                    Some(d) => Err(d.reason),
                    None => Ok(ids),
                }
            }),
        };
        let (index, backfill) = match plan {
            Ok(reembed::Plan::Load) => {
                let index =
                    SwappableIndex::building(HnswIndex::new(index_config(embedder.dimension())));
                let backfill =
                    Backfill::start(embedder.clone(), index.clone(), store.clone(), Vec::new());
                load_in_background(
                    &index_dir,
                    embedder.dimension(),
                    store,
                    preloaded,
                    &index,
                    &backfill,
                    PATIENCE,
                );
                (index, backfill)
            }
            Ok(reembed::Plan::Reembed {
                migration,
                stale,
                unembedded,
            }) => {
                let index =
                    SwappableIndex::ready(HnswIndex::new(index_config(embedder.dimension())));
                let backfill = Backfill::start_reembedding(
                    embedder.clone(),
                    index.clone(),
                    store.clone(),
                    unembedded,
                    stale,
                    Some(migration),
                );
                (index, backfill)
            }
            Err(why) => return Status::Disabled(why),
        };
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let semantic = Arc::new(Self {
            embedder,
            index,
            index_dir,
            fallbacks: AtomicU64::new(0),
            candidates: CandidateLiterals::default(),
            fallback_reasons: Default::default(),
            flood_warned_ms: Default::default(),
            backfill,
            stop_tx: Mutex::new(Some(stop_tx)),
            maintenance: Mutex::new(None),
        });
        let every = Duration::from_secs(config.index_save_interval_s);
        let weak = Arc::downgrade(&semantic);
        let thread = std::thread::Builder::new()
            .name("reprise-index".into())
            .spawn(move || maintain(weak, stop_rx, every))
            .ok();
        *lock(&semantic.maintenance) = thread;
        Status::Ready(semantic)
    }

    /// Fallbacks so far, by reason.
    pub fn fallbacks(&self) -> Fallbacks {
        let get = |r: FallbackReason| self.fallback_reasons[r as usize].load(Ordering::Relaxed);
        Fallbacks {
            overload: get(FallbackReason::Overload),
            deadline: get(FallbackReason::Deadline),
            failed: get(FallbackReason::Failed),
            scan_busy: get(FallbackReason::ScanBusy),
        }
    }

    /// Counts a fallback and says why: once per request for a late or failed embedding, at most
    /// once per [`FLOOD_WARN_EVERY_MS`] for overload and busy scans (which by nature come in floods).
    fn fall_back(&self, reason: FallbackReason, err: Option<&EmbedError>) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.fallback_reasons[reason as usize].fetch_add(1, Ordering::Relaxed);
        let flood = |reason: FallbackReason| {
            let warned = &self.flood_warned_ms[reason as usize];
            let now = unix_ms();
            let last = warned.load(Ordering::Relaxed);
            now.saturating_sub(last) >= FLOOD_WARN_EVERY_MS
                && warned
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
        };
        match reason {
            FallbackReason::Overload => {
                if flood(reason) {
                    tracing::warn!(
                        overloaded = self.fallbacks().overload,
                        "embedding queue overloaded: misses skip semantic matching at once (exact only); their entries are embedded later"
                    );
                }
            }
            FallbackReason::Deadline => tracing::warn!(
                "embedding missed its deadline; exact matching only for this request"
            ),
            FallbackReason::Failed => tracing::warn!(
                error = %err.map(ToString::to_string).unwrap_or_default(),
                "embedding failed; exact matching only for this request"
            ),
            FallbackReason::ScanBusy => {
                if flood(reason) {
                    tracing::warn!(
                        busy = self.fallbacks().scan_busy,
                        graphs_pending = self.index.current().graphs_pending(),
                        "a partition awaiting its graph is scanned exactly (more than 64 results wanted, or its sketches off), and every core is scanning: lookups beyond that skip semantic matching until the graphs are built"
                    );
                }
            }
        }
    }

    /// Stops the maintenance and backfill threads and saves the index (shutdown).
    pub fn stop(&self) {
        self.backfill.stop();
        lock(&self.stop_tx).take();
        if let Some(thread) = lock(&self.maintenance).take() {
            let _ = thread.join();
        }
        self.save();
    }

    /// Rebuilds the index from the vectors in the store, for a replica that missed changes of the
    /// shared store. Blocking. The old index serves meanwhile; changes made meanwhile are kept.
    pub fn resync(&self, store: &dyn Store) -> Rebuild {
        let mut unembedded = Vec::new();
        let rebuilt =
            self.index
                .rebuild_noting(store, self.embedder.dimension(), PATIENCE, &mut unembedded);
        enqueue_unembedded(&self.backfill, unembedded);
        if let Rebuild::Done(vectors) = rebuilt {
            tracing::info!(vectors, "vector index rebuilt from the shared store");
        }
        rebuilt
    }

    /// Embeds a prompt for a search or for storing with its answer, with the time it took. `None`
    /// when the prompt is empty (nothing to match); the fallback's reason when the embedding is
    /// refused (overload), late or failed: the request then goes on with exact matching only, and
    /// the fallback is counted by its reason.
    pub async fn embed(&self, prompt: &str) -> Result<Option<(Vec<f32>, f64)>, FallbackReason> {
        if prompt.trim().is_empty() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        match self.embedder.embed(prompt).await {
            Ok(v) => Ok(Some((v, crate::timing::millis(started.elapsed())))),
            Err(err) => {
                let reason = FallbackReason::of(&err);
                self.fall_back(reason, Some(&err));
                Err(reason)
            }
        }
    }

    /// Looks for a live entry of `query`'s partition at or above its threshold that passes its
    /// guards (and is younger than its `max_age_s`), near `vector`.
    pub async fn search(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        vector: Vec<f32>,
        query: Query,
    ) -> Outcome {
        let searched = std::time::Instant::now();
        let (this, store) = (self.clone(), store.clone());
        // The graph walk is CPU work: keep it off the async workers.
        let found = tokio::task::spawn_blocking(move || this.best_live(&*store, &vector, &query))
            .await
            .unwrap_or_default();
        Outcome {
            hit: found.hit,
            nearest: found.nearest,
            nearest_entry: found.nearest_entry,
            nearest_guard: found.nearest_guard,
            refused: found.refused,
            skipped: found.skipped,
            search_ms: Some(crate::timing::millis(searched.elapsed())),
        }
    }

    /// The best live entry at or above the threshold that the guards let through, and what the
    /// best candidate scored. Entries that are gone or expired are tombstoned in the index on the
    /// way, so they are never served.
    fn best_live(&self, store: &dyn Store, query: &[f32], request: &Query) -> Found {
        let neighbors =
            match self
                .index
                .search_now(&request.partition, query, CANDIDATES, request.serve_at)
            {
                Ok(neighbors) => neighbors,
                Err(ScansBusy) => {
                    self.fall_back(FallbackReason::ScanBusy, None);
                    return Found {
                        skipped: Some(FallbackReason::ScanBusy),
                        ..Found::default()
                    };
                }
            };
        let now = unix_ms();
        // The request's literals are read once, and only when a guard runs.
        let literals = (!request.guards.is_empty()).then(|| Literals::of(&request.prompt));
        let refuses = |entry: &Entry| {
            let query = literals.as_ref()?;
            request.guards.refuses(query, &self.candidates.of(entry))
        };
        let mut found = Found::default();
        let mut refused = None;
        for n in neighbors {
            // The cold half decides (partition, expiry, prompt for the guards, age); the answer
            // is read as a replay for the hit alone, not decoded for every candidate (two thirds
            // of a whole entry's read).
            let entry = match store.cold(&[EntryId(n.id)]).map(|mut found| found.pop()) {
                Ok(Some(e)) if !e.is_expired(now) && e.partition.0 == request.partition => e,
                Ok(_) => {
                    self.index.remove(n.id);
                    continue;
                }
                Err(_) => continue,
            };
            let nearest = found.nearest.is_none();
            if !nearest && n.similarity < request.threshold {
                break;
            }
            let guard = refuses(&entry);
            if nearest {
                found.nearest = Some(n.similarity);
                found.nearest_entry = Some(entry.id);
                found.nearest_guard = guard;
            }
            if n.similarity < request.threshold {
                break;
            }
            let age_s = entry.age_s(now);
            if request.max_age_s.is_some_and(|max| age_s > max) {
                continue;
            }
            if let Some(guard) = guard {
                // A close neighbour with other numbers or an opposite negation: the next one may
                // still be the same question.
                refused.get_or_insert(guard);
                continue;
            }
            // Read last, for the one candidate served: its answer, which the cold half lacks. A
            // replay gone (its half evicted or unreadable) leaves the entry unservable: dropped
            // from the index like a missing entry, and the next candidate tried.
            let replay = match store.replay(entry.id) {
                Ok(Some(replay)) => Arc::new(replay),
                Ok(None) => {
                    self.index.remove(n.id);
                    continue;
                }
                Err(_) => continue,
            };
            found.hit = Some(Hit {
                entry,
                similarity: n.similarity,
                replay,
            });
            break;
        }
        // A refusal counts when it left the request without a match: a wrong answer not given.
        if found.hit.is_none() {
            found.refused = refused;
        }
        found
    }

    /// Saves the index dump (periodically and at shutdown); not while a rebuild is still running,
    /// when the graph is incomplete, nor when the dump on disk already holds the index.
    pub fn save(&self) {
        if let Err(err) = self.index.save(&self.index_dir) {
            tracing::warn!(error = %err, dir = %self.index_dir.display(), "saving the vector index failed");
        }
    }
}

/// Does the work one partition of the index needs each tick (a graph for a flat partition past
/// `brute_force_below`, the largest first, as after a rebuild from the store; a rebuild when its
/// tombstones pile up; see [`HnswIndex::maybe_rebuild`]), and saves the index every `save_every`,
/// until stopped.
/// Holds only a weak reference, so a dropped gateway does not stay alive for its maintenance.
fn maintain(
    weak: std::sync::Weak<Semantic>,
    stop: std::sync::mpsc::Receiver<()>,
    save_every: Duration,
) {
    let tick = Duration::from_secs(5).min(save_every);
    let mut last_save = std::time::Instant::now();
    // After a partition's work, the next one's starts at once (a rebuild from the store leaves
    // several partitions waiting for their graph); otherwise one look per tick.
    let mut wait = tick;
    loop {
        match stop.recv_timeout(wait) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(semantic) = weak.upgrade() else {
            return;
        };
        wait = tick;
        if !semantic.index.is_building() && semantic.index.current().maybe_rebuild() {
            semantic.index.changed();
            wait = Duration::ZERO;
            tracing::info!(
                vectors = semantic.index.len(),
                graphs_pending = semantic.index.current().graphs_pending(),
                "a partition of the vector index rebuilt (its tombstones dropped, or its graph made, split, merged or made flat) or a graph segment sealed"
            );
        }
        // A save writes nothing when nothing changed since the dump on disk.
        if last_save.elapsed() >= save_every {
            semantic.save();
            last_save = std::time::Instant::now();
        }
    }
}

/// The index settings the gateway runs with (also used by the benches).
pub fn index_config(dimension: usize) -> IndexConfig {
    IndexConfig {
        // Measured at 100k vectors in one shared f32 graph: ef 64 gave recall@1 0.94-0.98, ef 128
        // 0.99-1.0. With a graph per partition (f16), a 98k partition gave 0.916 at ef 64 and
        // 0.997 at 128, p50 4.2 ms (benches/results/2026-12-05-scale.md). The sketch recheck
        // finds what ef 64 misses (hit search p50 0.77 against 1.12 ms at 1M), but only when the
        // graph found nothing above the threshold: at ef 64 the graph alone misses the nearest
        // row of 10.6% of clustered queries at 1M (1.6% at 128), and one that finds another row
        // above the threshold serves that less similar row, so the width stays
        // (benches/results/2026-12-06-sketch-recheck.md, 2026-12-07-recheck-share.md).
        ef_search: 128,
        // An exact scan of 10k vectors (~0.5 ms) beats the graph and is always exact.
        brute_force_below: 10_000,
        ..IndexConfig::new(dimension)
    }
}

/// Entries read per store call at start-up and in a rebuild: one round trip to Redis each.
const PAGE: usize = 512;

/// How a read of the whole store (start-up, a rebuild) retries a page that failed: a Redis
/// failover or a network blip lasts seconds, while a rebuild of a million vectors reads its pages
/// over half an hour, which one failed page must not cut short.
#[derive(Debug, Clone, Copy)]
struct Patience {
    attempts: u32,
    first_wait: Duration,
}

/// 0.5 + 1 + 2 + 4 s between five attempts.
const PATIENCE: Patience = Patience {
    attempts: 5,
    first_wait: Duration::from_millis(500),
};

impl Patience {
    /// `read`'s result, retried with doubling waits while it fails, at most `attempts` times.
    fn read<T>(
        self,
        what: &str,
        mut read: impl FnMut() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (mut attempt, mut wait) = (1, self.first_wait);
        loop {
            match read() {
                Err(err) if attempt < self.attempts => {
                    // The caller says what it comes to, once.
                    tracing::debug!(error = %err, attempt, what, "reading the store failed; retrying");
                    std::thread::sleep(wait);
                    attempt += 1;
                    wait = wait.saturating_mul(2);
                }
                done => return done,
            }
        }
    }
}

/// The ids of the stored entries that have a vector (what the index must hold), and of those
/// that should have one and have none (for the backfill). Reads the cold halves a page at a time
/// and keeps no vector: at a million entries, holding them all as f32 took 1.5 GB beside the index.
/// A store that knows which entries have a vector (sled's ledger) spares reading those: only the
/// others are read, to tell which of them should have one. An error once a read failed
/// `patience.attempts` times: a list missing some ids would make an index that lacks them.
fn stored_ids(
    store: &dyn Store,
    patience: Patience,
) -> Result<(BTreeSet<u64>, Vec<u64>), StoreError> {
    stored_ids_trusting(store, patience, |_| None, Unvouched::Read)
}

/// What [`stored_ids_trusting`] does with the entries of a store that cannot tell which have a
/// vector, when there is no index dump to vouch for any of them (one that vouches for none, far
/// behind or another store's, has them read: `load_dump` may still use it, given the exact ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unvouched {
    /// Reads them, to list exactly those with a vector and those that want one.
    Read,
    /// Lists them all unread, as if each had a vector, for a build from the store that reads every
    /// entry's cold half anyway and skips those without one ([`StoredVectors`], which also notes
    /// those that want one). Reading them first would read the whole store twice: a fresh Redis
    /// replica of a million entries spent about a quarter of its start on the first read.
    LeftToTheBuild,
}

/// As [`stored_ids`]; a store that cannot tell which entries have a vector (Redis) also spares
/// reading those `dumped` names, given its ids: the ids of an index dump checked against the
/// store, whose entries had a vector when it was saved and still have it (an entry's vector is
/// only ever added, or replaced for another model, which refuses the dump). `dumped` is `None`
/// when there is no dump: `unvouched` then says whether the entries are read or left to the build.
fn stored_ids_trusting(
    store: &dyn Store,
    patience: Patience,
    dumped: impl FnOnce(&[EntryId]) -> Option<BTreeSet<u64>>,
    unvouched: Unvouched,
) -> Result<(BTreeSet<u64>, Vec<u64>), StoreError> {
    let mut with_vector = BTreeSet::new();
    let mut unembedded = Vec::new();
    let to_read = match store.vector_ids() {
        Some((with, without)) => {
            with_vector.extend(with.into_iter().map(|id| id.0));
            without
        }
        None => {
            let ids = patience.read("the stored ids", || store.ids())?;
            let Some(dumped) = dumped(&ids).or((unvouched == Unvouched::Read).then(BTreeSet::new))
            else {
                return Ok((ids.into_iter().map(|id| id.0).collect(), Vec::new()));
            };
            let (held, rest): (Vec<EntryId>, Vec<EntryId>) =
                ids.into_iter().partition(|id| dumped.contains(&id.0));
            with_vector.extend(held.into_iter().map(|id| id.0));
            rest
        }
    };
    for page in to_read.chunks(PAGE) {
        for entry in patience.read("stored entries", || store.cold(page))? {
            if wants_vector(&entry) {
                unembedded.push(entry.id.0);
            }
            if entry.vector.is_some() {
                with_vector.insert(entry.id.0);
            }
        }
    }
    Ok((with_vector, unembedded))
}

/// The stored vectors of `ids`, read from the store a page at a time as the index build consumes
/// them (the build encodes each as it comes), so no more than a page of f32 vectors is held.
/// An entry deleted since its id was read is skipped; one changed since is read as it is now
/// (a rebuild replays the changes made meanwhile on top). A page that cannot be read after
/// `patience` ends the stream, and [`StoredVectors::failed`] says why.
struct StoredVectors<S> {
    store: S,
    ids: std::vec::IntoIter<u64>,
    page: std::vec::IntoIter<Entry>,
    patience: Patience,
    failed: Option<StoreError>,
    /// Entries read without a vector that want one (see [`wants_vector`]), for the backfill.
    unembedded: Vec<u64>,
}

impl<S: std::ops::Deref<Target = T>, T: Store + ?Sized> StoredVectors<S> {
    fn new(store: S, ids: BTreeSet<u64>, patience: Patience) -> Self {
        Self {
            store,
            ids: ids.into_iter().collect::<Vec<_>>().into_iter(),
            page: Vec::new().into_iter(),
            patience,
            failed: None,
            unembedded: Vec::new(),
        }
    }

    /// Why the stream ended before its last id, if it did, and the entries read that want a
    /// vector.
    fn finish(self) -> (Option<StoreError>, Vec<u64>) {
        (self.failed, self.unembedded)
    }
}

impl<S: std::ops::Deref<Target = T>, T: Store + ?Sized> Iterator for StoredVectors<S> {
    type Item = (u64, [u8; 32], Vec<f32>);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            for entry in self.page.by_ref() {
                if wants_vector(&entry) {
                    self.unembedded.push(entry.id.0);
                }
                if let Some(vector) = entry.vector {
                    return Some((entry.id.0, entry.partition.0, vector));
                }
            }
            if self.failed.is_some() {
                return None;
            }
            let ids: Vec<EntryId> = self.ids.by_ref().take(PAGE).map(EntryId).collect();
            if ids.is_empty() {
                return None;
            }
            match self
                .patience
                .read("stored vectors", || self.store.cold(&ids))
            {
                Ok(entries) => self.page = entries.into_iter(),
                Err(err) => {
                    self.failed = Some(err);
                    return None;
                }
            }
        }
    }
}

/// Builds the index of the stored vectors of `ids`, its graphs now or left to the maintenance
/// ([`Graphs`]), and says why it lacks the rest if the store could not be read whole (the rest
/// stays reachable by exact key), and which of the entries it read want a vector.
fn build_from_store(
    store: &dyn Store,
    dimension: usize,
    ids: BTreeSet<u64>,
    patience: Patience,
    graphs: Graphs,
) -> (HnswIndex, Option<StoreError>, Vec<u64>) {
    let mut vectors = StoredVectors::new(store, ids, patience);
    let built = HnswIndex::build_with(index_config(dimension), &mut vectors, graphs);
    let (failed, unembedded) = vectors.finish();
    (built, failed, unembedded)
}

/// The dump as [`DumpPreload`] loaded it, when it did.
type Preloaded = Option<Result<HnswIndex, IndexError>>;

/// Fills `index`, which serves meanwhile (in its building state), on a background thread: reads
/// the stored ids, hands those without a vector to `backfill`, and loads the dump when it matches
/// the store, or else rebuilds from the stored vectors (minutes at 100k entries). The gateway
/// serves at once with the empty index (exact matches, and new entries), `/healthz` showing
/// `index_rebuilding` until the whole index replaces it: a dump of a million vectors takes about
/// 11 s to load, which the gateway used to spend before it listened, and so did the scan of a
/// shared store's ids. A store that cannot be read (after [`PATIENCE`]) is read again with
/// growing waits, up to [`MOST_PATIENT`], until it is: the ids and the dump's check wait for it,
/// and an index built from part of the vectors serves meanwhile, marked partial (never saved over
/// the dump) until a rebuild reads the store whole.
fn load_in_background(
    dir: &Path,
    dimension: usize,
    store: &Arc<dyn Store>,
    preloaded: Preloaded,
    index: &Arc<SwappableIndex>,
    backfill: &Arc<Backfill>,
    patience: Patience,
) {
    let (target, store, backfill) = (index.clone(), store.clone(), backfill.clone());
    let dir = dir.to_owned();
    let spawned = std::thread::Builder::new()
        .name("reprise-index-build".into())
        .spawn(move || {
            let mut wait = patience.first_wait;
            let mut pause = || {
                std::thread::sleep(wait);
                wait = wait.saturating_mul(2).min(MOST_PATIENT);
            };
            let mut preloaded = preloaded;
            loop {
                let started = std::time::Instant::now();
                let dumped = |stored: &[EntryId]| {
                    dumped_ids(&dir, dimension, store.as_ref(), stored, &mut preloaded, patience)
                };
                let read = stored_ids_trusting(
                    store.as_ref(),
                    patience,
                    dumped,
                    Unvouched::LeftToTheBuild,
                );
                let (expected, unembedded) = match read {
                    Ok(ids) => ids,
                    Err(err) => {
                        tracing::warn!(error = %err, "the stored entries' ids could not be read: the vector index waits for the store (exact matches meanwhile)");
                        pause();
                        continue;
                    }
                };
                enqueue_unembedded(&backfill, unembedded);
                tracing::debug!(
                    ms = started.elapsed().as_millis() as u64,
                    "stored ids read for the vector index"
                );
                let filled = if expected.is_empty() {
                    // Nothing to index: a dump could only hold what the store no longer has.
                    target.finish(HnswIndex::new(index_config(dimension)));
                    Ok((Installed::Whole, Vec::new()))
                } else {
                    let preloaded = preloaded.take();
                    load_or_rebuild(&dir, dimension, &store, &expected, preloaded, &target, patience)
                };
                // Those the build found (entries left unread above), once the index serves.
                let filled = filled.map(|(what, unembedded)| {
                    enqueue_unembedded(&backfill, unembedded);
                    what
                });
                match filled {
                    Ok(Installed::Partial) => break,
                    Ok(Installed::Whole | Installed::AsDumped) => return,
                    Err(why) => {
                        tracing::warn!(%why, "the index dump could not be checked against the store: loaded again once the store reads");
                        pause();
                    }
                }
            }
            tracing::warn!("the store could not be read whole: the vector index lacks the rest until a rebuild reads it, retried until one does");
            loop {
                pause();
                // A replica's resync may have put a whole index in service meanwhile.
                if !target.is_partial() {
                    return;
                }
                let mut unembedded = Vec::new();
                let rebuilt = target.rebuild_noting(store.as_ref(), dimension, patience, &mut unembedded);
                enqueue_unembedded(&backfill, unembedded);
                match rebuilt {
                    Rebuild::Done(vectors) => {
                        tracing::info!(vectors, "vector index rebuilt from the store");
                        return;
                    }
                    Rebuild::Busy => {}
                    Rebuild::Incomplete(err) => {
                        tracing::warn!(error = %err, "rebuilding the vector index from the store failed again");
                    }
                }
            }
        });
    if let Err(err) = spawned {
        // Out of the building state, or no dump would ever be saved and every change kept.
        index.finish(HnswIndex::new(index_config(dimension)));
        tracing::error!(error = %err, "could not start the index load thread: the vector index starts empty");
    }
}

/// Hands the stored entries without a vector to the backfill (named again after a retry: it keeps
/// each id once).
fn enqueue_unembedded(backfill: &Backfill, unembedded: Vec<u64>) {
    if !unembedded.is_empty() {
        tracing::info!(
            entries = unembedded.len(),
            "stored entries without a vector will be embedded in the background"
        );
    }
    for id in unembedded {
        backfill.enqueue(EntryId(id));
    }
}

/// Puts the dump in service, brought up to the store's `expected` ids, or else an index rebuilt
/// from the stored vectors, and says which it holds, with the entries it read that want a vector;
/// nothing, and why, when the dump could not be checked against the store (which did not read).
fn load_or_rebuild(
    dir: &Path,
    dimension: usize,
    store: &Arc<dyn Store>,
    expected: &BTreeSet<u64>,
    preloaded: Preloaded,
    target: &SwappableIndex,
    patience: Patience,
) -> Result<(Installed, Vec<u64>), String> {
    let started = std::time::Instant::now();
    match load_dump(dir, dimension, store, expected, preloaded, patience) {
        Ok((index, caught_up)) => {
            tracing::info!(
                vectors = index.len(),
                added = caught_up.added,
                removed = caught_up.removed,
                ms = started.elapsed().as_millis() as u64,
                "vector index loaded from its dump"
            );
            target.from_dump.store(true, Ordering::Relaxed);
            let what = match caught_up {
                CaughtUp {
                    failed: Some(_), ..
                } => Installed::Partial,
                CaughtUp {
                    added: 0,
                    removed: 0,
                    ..
                } => Installed::AsDumped,
                _ => Installed::Whole,
            };
            target.install(index, what);
            Ok((what, caught_up.unembedded))
        }
        Err(DumpUnused::Unchecked(why)) => Err(why),
        Err(reason) => {
            let count = expected.len();
            tracing::warn!(vectors = count, %reason, "rebuilding the vector index in the background: semantic hits resume once the store is read (flat partitions, the large ones searched by their rows' sketches), large partitions get their graphs after");
            // The index in service is empty: every vector is searched once the store is read, in
            // a minute at a million entries, instead of after half an hour of graphs.
            let (built, failed, unembedded) = build_from_store(
                store.as_ref(),
                dimension,
                expected.clone(),
                patience,
                Graphs::Later,
            );
            tracing::info!(
                vectors = built.len(),
                whole = failed.is_none(),
                ms = started.elapsed().as_millis() as u64,
                "vector index rebuilt from the store"
            );
            let what = match failed {
                None => Installed::Whole,
                Some(_) => Installed::Partial,
            };
            target.install(built, what);
            Ok((what, unembedded))
        }
    }
}

/// The longest wait between two reads of a store that cannot be read whole at start.
const MOST_PATIENT: Duration = Duration::from_secs(60);

/// The index dump's load, started on its own thread before the store opens, which `AppState`
/// does when the open will scan the store (after a crash: a minute or more at a million entries,
/// beside the load's 10-14 s); neither needs the other until the dump is brought up to the
/// store's ids. It loads at the dimension its manifest names; one that is not the model's is
/// refused then. The semantic stage joins it before anything may delete the dump. Unused (the
/// dump refused, the store re-embedded or empty), what it read is freed. It reads the graphs'
/// vectors into the heap ([`HnswIndex::load_in_memory`]), where a load once the store is open maps
/// them from the dump's files: the store's open moves a corrupt store's index aside. Dropped
/// without a join (semantic matching disabled), its thread finishes on its own.
pub struct DumpPreload(std::thread::JoinHandle<Result<HnswIndex, IndexError>>);

impl DumpPreload {
    /// Starts loading `<data dir>/index`; `None` with semantic matching off or no dump there.
    pub fn start(config: &Config) -> Option<Self> {
        if !config.semantic {
            return None;
        }
        let dir = config.data_dir.join("index");
        let dump = HnswIndex::dump_summary(&dir)?;
        std::thread::Builder::new()
            .name("reprise-index-load".into())
            .spawn(move || {
                // Behind the store's open (the gateway listens once it is done) and then the
                // first requests; the loader's own threads inherit it.
                crate::priority::lower_this_thread();
                // In memory: the open may move a corrupt store's index aside meanwhile.
                HnswIndex::load_in_memory(&dir, index_config(dump.dimension))
            })
            .inspect_err(|e| tracing::warn!(error = %e, "could not start the index dump's load early; it loads once the store is open"))
            .ok()
            .map(Self)
    }

    fn join(self) -> Result<HnswIndex, IndexError> {
        self.0.join().unwrap_or_else(|_| {
            Err(IndexError::Corrupt(
                "the dump's load thread panicked".into(),
            ))
        })
    }
}

/// What loading a dump changed to match the store.
struct CaughtUp {
    /// Stored entries the dump did not hold, indexed from their stored vectors.
    added: usize,
    /// Entries of the dump the store no longer has, removed (tombstones until the partition's
    /// next rebuild).
    removed: usize,
    /// Why some of the missing could not be read (the index lacks them), if so.
    failed: Option<StoreError>,
    /// Of the entries read, those that want a vector.
    unembedded: Vec<u64>,
}

/// Why the dump was not used; every case means a rebuild from the store.
#[derive(Debug, thiserror::Error)]
enum DumpUnused {
    #[error(transparent)]
    Unreadable(#[from] IndexError),
    #[error("the dump lacks {missing} of the store's {stored} vectors: a rebuild on every core is quicker than adding them one at a time")]
    FarBehind { missing: usize, stored: usize },
    #[error("the dump holds another vector for entry {id} than the store: it was saved for another store (one whose ids started over)")]
    OtherStore { id: u64 },
    #[error("the dump could not be checked against the store: {0}")]
    Unchecked(String),
}

/// Loads the index dump and brings it up to the store's `expected` ids (after checking that it
/// was saved for this store). A dump is saved at shutdown
/// and every `index_save_interval_s` while the index changes, so after a crash it lacks the last
/// minutes' entries (and holds some the store dropped since), and a replica of a shared store
/// restarts behind what the others wrote: the difference is applied here instead of rebuilding a
/// whole index (34 minutes at a million vectors) for it. Ids are never reused (sled's
/// `generate_id`, Redis's `INCR` counter), so an id in both names the same entry and vector. Entries stored while this runs are replayed by
/// [`SwappableIndex::finish`], as for a rebuild.
fn load_dump(
    dir: &Path,
    dimension: usize,
    store: &Arc<dyn Store>,
    expected: &BTreeSet<u64>,
    preloaded: Preloaded,
    patience: Patience,
) -> Result<(HnswIndex, CaughtUp), DumpUnused> {
    // The missing are inserted one at a time on this thread, where a rebuild inserts every vector
    // with all cores: past `expected / cores` the rebuild is the quicker (and leaves no tombstones).
    let most_missing = most_missing(expected.len());
    let far_behind = |missing: usize| DumpUnused::FarBehind {
        missing,
        stored: expected.len(),
    };
    let started = std::time::Instant::now();
    let index = match preloaded {
        Some(loaded) => loaded?,
        None => {
            // The manifest's count bounds what is missing from below: a dump too far behind is
            // refused before its graphs are read (11-14 s at a million vectors).
            if let Some(dump) = HnswIndex::dump_summary(dir) {
                if expected.len().saturating_sub(dump.vectors) > most_missing {
                    return Err(far_behind(expected.len() - dump.vectors));
                }
            }
            HnswIndex::load(dir, index_config(dimension))?
        }
    };
    if index.dimension() != dimension {
        return Err(IndexError::Dimension {
            expected: dimension,
            found: index.dimension(),
        }
        .into());
    }
    let loaded = started.elapsed();
    let held = index.ids();
    let missing: BTreeSet<u64> = expected.difference(&held).copied().collect();
    if missing.len() > most_missing {
        return Err(far_behind(missing.len()));
    }
    let both: Vec<u64> = held.intersection(expected).copied().collect();
    check_sample(&index, &both, store.as_ref(), patience)?;
    // Removed once the store confirms it lacks them: a scan cut short by a store error (Redis,
    // which has no ledger of ids) lists fewer ids than the store holds, and those must stay.
    let mut removed = 0;
    let gone: Vec<EntryId> = held.difference(expected).map(|&id| EntryId(id)).collect();
    for page in gone.chunks(PAGE) {
        let stored: BTreeSet<EntryId> = match patience.read("stored entries", || store.cold(page)) {
            Ok(entries) => entries.into_iter().map(|e| e.id).collect(),
            Err(err) => {
                tracing::warn!(error = %err, "reading the store failed; the dump's entries it may still hold are kept");
                continue;
            }
        };
        for id in page.iter().filter(|id| !stored.contains(id)) {
            index.remove(id.0);
            removed += 1;
        }
    }
    let checked = started.elapsed();
    let mut added = 0;
    let mut vectors = StoredVectors::new(store.as_ref(), missing, patience);
    for (id, partition, vector) in &mut vectors {
        index.insert(id, partition, &vector);
        added += 1;
    }
    tracing::debug!(
        load_ms = loaded.as_millis() as u64,
        check_ms = (checked - loaded).as_millis() as u64,
        catch_up_ms = (started.elapsed() - checked).as_millis() as u64,
        "index dump loaded, checked and caught up"
    );
    let (failed, unembedded) = vectors.finish();
    Ok((
        index,
        CaughtUp {
            added,
            removed,
            failed,
            unembedded,
        },
    ))
}

/// The most vectors of `stored` a dump may lack and still be brought up to the store, one insert
/// at a time on the loading thread: past `stored / cores` a rebuild on every core is the quicker
/// (and leaves no tombstones). Below a page (512), adding takes well under a second at any size.
fn most_missing(stored: usize) -> usize {
    (stored / crate::priority::cores()).max(PAGE)
}

/// Checks that `index` (a dump) was saved for this store, given `both`, the ids both hold. An id
/// names one entry for the life of a store, but a store that starts over (Redis emptied, or a
/// data dir pointed at another Redis) gives the same ids to other entries: a page of `both`,
/// spread over them, must have the dump's vector and partition.
fn check_sample(
    index: &HnswIndex,
    both: &[u64],
    store: &dyn Store,
    patience: Patience,
) -> Result<(), DumpUnused> {
    let sample: Vec<EntryId> = both
        .iter()
        .step_by(both.len().div_ceil(PAGE).max(1))
        .map(|&id| EntryId(id))
        .collect();
    let entries = patience
        .read("a sample of the stored entries", || store.cold(&sample))
        .map_err(|e| DumpUnused::Unchecked(e.to_string()))?;
    for entry in entries {
        let held_as_stored = entry
            .vector
            .as_ref()
            .is_some_and(|v| index.holds(entry.id.0, &entry.partition.0, v));
        if !held_as_stored {
            return Err(DumpUnused::OtherStore { id: entry.id.0 });
        }
    }
    Ok(())
}

/// For a store that cannot tell which of its entries have a vector (Redis), the ids of `stored`
/// that the index dump holds, once a sample of them matches the store (none otherwise): the dump
/// is loaded into `preloaded` before the store's entries are read rather than after, so that only
/// the entries stored since it was saved are read. A replica restarting on a million entries
/// otherwise reads every cold half (3 GB, about a minute) to learn which vectors its own dump
/// already holds. `None` when there is no dump of this dimension that loads: the index is then
/// built from the store, which reads every entry anyway.
fn dumped_ids(
    dir: &Path,
    dimension: usize,
    store: &dyn Store,
    stored: &[EntryId],
    preloaded: &mut Preloaded,
    patience: Patience,
) -> Option<BTreeSet<u64>> {
    if preloaded.is_none() {
        let dump = HnswIndex::dump_summary(dir).filter(|d| d.dimension == dimension)?;
        // As `load_dump` refuses it, from its manifest's count alone: a dump too far behind is
        // rebuilt from the store, which the reading of every entry serves. (`stored` counts the
        // entries without a vector too: a dump that only looks too far behind is read in full,
        // and then loaded when the entries with a vector show it is not.)
        if stored.len().saturating_sub(dump.vectors) > most_missing(stored.len()) {
            return Some(BTreeSet::new());
        }
        *preloaded = Some(HnswIndex::load(dir, index_config(dimension)));
    }
    let Some(Ok(index)) = preloaded.as_ref() else {
        return None;
    };
    let held = index.ids();
    let both: Vec<u64> = stored
        .iter()
        .map(|id| id.0)
        .filter(|id| held.contains(id))
        .collect();
    match check_sample(index, &both, store, patience) {
        Ok(()) => Some(both.into_iter().collect()),
        Err(why) => {
            tracing::info!(%why, "the index dump could not be matched with the store: every stored entry is read to list its vectors");
            Some(BTreeSet::new())
        }
    }
}

/// Changes are deferred while this lives: see [`SwappableIndex::defer_changes`].
#[must_use = "changes are applied when the guard drops"]
struct Deferring<'a> {
    index: &'a SwappableIndex,
    /// The index's version when the deferral began: what a dump written meanwhile holds.
    version: u64,
}

impl Drop for Deferring<'_> {
    fn drop(&mut self) {
        self.index.apply_deferred();
    }
}

/// A change made while a rebuild runs, replayed into the rebuilt index before it replaces the old,
/// or while a dump is written, applied after it.
#[derive(Clone)]
enum Change {
    Insert(u64, [u8; 32], Vec<f32>),
    Remove(u64),
}

impl Change {
    fn apply(self, index: &HnswIndex) {
        match self {
            Change::Insert(id, partition, vector) => index.insert(id, partition, &vector),
            Change::Remove(id) => index.remove(id),
        }
    }
}

/// What a rebuild of the index from the store came to.
#[derive(Debug)]
pub enum Rebuild {
    /// In service, with this many vectors.
    Done(usize),
    /// Another rebuild was running; nothing done.
    Busy,
    /// The store could not be read whole; worth another try later.
    Incomplete(StoreError),
}

/// The index the gateway searches: swappable, so a rebuild can run while requests are served.
pub struct SwappableIndex {
    slot: std::sync::RwLock<Arc<HnswIndex>>,
    /// `Some` while a background rebuild runs: the changes made since it started.
    pending: Mutex<Option<Vec<Change>>>,
    /// Whether the index in service came from the dump at start (else built or rebuilt).
    from_dump: AtomicBool,
    /// `Some` while a dump is written: the changes made meanwhile, applied once it is done.
    /// Locked after `pending`.
    deferred: Mutex<Option<Vec<Change>>>,
    /// Counts the changes and swaps of the index in service, under the `pending` lock.
    version: AtomicU64,
    /// The `version` the dump on disk holds ([`NOT_ON_DISK`] if none is known to): a save with
    /// nothing changed since writes nothing (1.5 GB and 6 s at a million vectors, at every
    /// shutdown).
    on_disk: AtomicU64,
    /// Whether the index in service lacks entries the store could not be read for: never saved,
    /// since its dump would replace a whole one.
    partial: AtomicBool,
}

/// What an index put in service holds, beside the changes replayed into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Installed {
    /// Every stored vector.
    Whole,
    /// Every stored vector, as the dump on disk holds them.
    AsDumped,
    /// Some of them: the store could not be read for the rest.
    Partial,
}

/// [`SwappableIndex::on_disk`] when no dump is known to hold the index in service.
const NOT_ON_DISK: u64 = u64::MAX;

impl SwappableIndex {
    fn ready(index: HnswIndex) -> Arc<Self> {
        Self::serving(index, None)
    }

    /// Serving `empty` until a background build, which records the changes made meanwhile,
    /// [`finish`](SwappableIndex::finish)es.
    fn building(empty: HnswIndex) -> Arc<Self> {
        Self::serving(empty, Some(Vec::new()))
    }

    fn serving(index: HnswIndex, pending: Option<Vec<Change>>) -> Arc<Self> {
        Arc::new(Self {
            slot: std::sync::RwLock::new(Arc::new(index)),
            pending: Mutex::new(pending),
            from_dump: AtomicBool::new(false),
            deferred: Mutex::new(None),
            version: AtomicU64::new(0),
            on_disk: AtomicU64::new(NOT_ON_DISK),
            partial: AtomicBool::new(false),
        })
    }

    /// The index in service now.
    pub fn current(&self) -> Arc<HnswIndex> {
        self.slot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a background rebuild is still running.
    pub fn is_building(&self) -> bool {
        lock(&self.pending).is_some()
    }

    /// Whether the index in service was loaded from the dump at start (and caught up with the
    /// store), not rebuilt.
    pub fn from_dump(&self) -> bool {
        self.from_dump.load(Ordering::Relaxed)
    }

    /// Rebuilds from the store's vectors while this index serves; changes made meanwhile are
    /// kept. Blocking. `Busy` while another rebuild runs (it reads the store too). When the store
    /// cannot be read whole, what was read replaces the index in service only if it holds more
    /// vectors (the old one may have missed changes, not whole pages of entries), and the caller
    /// tries again later.
    #[cfg(test)]
    fn rebuild(&self, store: &dyn Store, dimension: usize, patience: Patience) -> Rebuild {
        self.rebuild_noting(store, dimension, patience, &mut Vec::new())
    }

    /// As `rebuild`, adding to `unembedded` the entries it read that want a vector (a store
    /// without a ledger is read once, by the build, so they are found there), for the backfill.
    fn rebuild_noting(
        &self,
        store: &dyn Store,
        dimension: usize,
        patience: Patience,
        unembedded: &mut Vec<u64>,
    ) -> Rebuild {
        if !self.begin_rebuild() {
            return Rebuild::Busy;
        }
        // The entries are read once, by the build.
        let ids = match stored_ids_trusting(store, patience, |_| None, Unvouched::LeftToTheBuild) {
            Ok((ids, listed)) => {
                // A store with a ledger lists those without a vector up front.
                unembedded.extend(listed);
                ids
            }
            Err(err) => {
                self.abandon_rebuild();
                return Rebuild::Incomplete(err);
            }
        };
        // An index in service with its graphs (a resync) keeps serving while the new one builds
        // its own; an empty one, or one still flat (a retry after a partial read, a resync soon
        // after a rebuild from the store), is replaced as soon as the store is read, its large
        // partitions searched flat until the maintenance builds their graphs (which it does not
        // while a rebuild runs).
        let graphs = if self.is_empty() || self.current().graphs_pending() > 0 {
            Graphs::Later
        } else {
            Graphs::Now
        };
        let (built, failed, found) = build_from_store(store, dimension, ids, patience, graphs);
        unembedded.extend(found);
        match (built, failed) {
            (built, None) => {
                let vectors = built.len();
                self.finish(built);
                Rebuild::Done(vectors)
            }
            (partial, Some(err)) => {
                if partial.len() > self.len() {
                    self.install(partial, Installed::Partial);
                } else {
                    self.abandon_rebuild();
                }
                Rebuild::Incomplete(err)
            }
        }
    }

    /// Ends a rebuild without a swap: the changes it recorded reached the index in service too.
    fn abandon_rebuild(&self) {
        *lock(&self.pending) = None;
    }

    /// Writes the index in service to `dir` unless a rebuild is running (its graph is about to be
    /// replaced), it is partial, or the dump there already holds it; true when it wrote one. The dump holds the
    /// index's writer lock while it writes (1.5 GB and seconds at a million vectors): inserts and
    /// removals wait for it in a list instead of blocking the cache's writer thread, and with it
    /// every store write. They are applied when the guard drops, a panicking save included.
    fn save(&self, dir: &Path) -> Result<bool, IndexError> {
        let Some(deferring) = self.defer_changes() else {
            return Ok(false);
        };
        if self.is_partial() {
            return Ok(false);
        }
        // Unless the dump was taken away meanwhile (`index/` removed or moved by hand).
        if self.on_disk.load(Ordering::Relaxed) == deferring.version
            && HnswIndex::dump_summary(dir).is_some()
        {
            return Ok(false);
        }
        self.current().save(dir)?;
        self.on_disk.store(deferring.version, Ordering::Relaxed);
        Ok(true)
    }

    /// Starts recording changes for a rebuild; false when one already runs.
    fn begin_rebuild(&self) -> bool {
        let mut pending = lock(&self.pending);
        if pending.is_some() {
            return false;
        }
        *pending = Some(Vec::new());
        true
    }

    /// From now until the guard drops, inserts and removals are kept in a list instead of reaching
    /// the index (searches do not see them meanwhile; a removed entry found is still checked
    /// against the store, so never served). `None` while a rebuild runs: the graph in service is
    /// then the old one, not worth a dump.
    fn defer_changes(&self) -> Option<Deferring<'_>> {
        let pending = lock(&self.pending);
        if pending.is_some() {
            return None;
        }
        lock(&self.deferred).get_or_insert_with(Vec::new);
        Some(Deferring {
            index: self,
            version: self.version.load(Ordering::Relaxed),
        })
    }

    /// Applies the changes kept since [`SwappableIndex::defer_changes`], a batch at a time outside
    /// the lock (changes made meanwhile join the list, so the order holds), then lets changes
    /// reach the index directly again.
    fn apply_deferred(&self) {
        // Should applying a change panic, changes still reach the index directly afterwards,
        // rather than piling up in the list for good. The batch's rest and what was queued
        // meanwhile are lost: inserts are not found semantically until a rebuild, and a removed
        // entry a search still finds is checked against the store, so never served.
        struct EndOnUnwind<'a> {
            index: &'a SwappableIndex,
            done: bool,
        }
        impl Drop for EndOnUnwind<'_> {
            fn drop(&mut self) {
                if !self.done {
                    *lock(&self.index.deferred) = None;
                }
            }
        }
        let mut end = EndOnUnwind {
            index: self,
            done: false,
        };
        loop {
            let batch = {
                let _pending = lock(&self.pending);
                let mut deferred = lock(&self.deferred);
                match deferred.as_mut() {
                    Some(changes) if !changes.is_empty() => std::mem::take(changes),
                    _ => {
                        *deferred = None;
                        end.done = true;
                        return;
                    }
                }
            };
            let current = self.current();
            for change in batch {
                change.apply(&current);
            }
        }
    }

    /// Applies `change` to the index in service, or keeps it while a dump is written; a running
    /// rebuild records it too.
    fn change(&self, change: Change) {
        let mut pending = lock(&self.pending);
        let mut deferred = lock(&self.deferred);
        self.version.fetch_add(1, Ordering::Relaxed);
        if let Some(changes) = pending.as_mut() {
            changes.push(change.clone());
        }
        match deferred.as_mut() {
            Some(later) => later.push(change),
            None => change.apply(&self.current()),
        }
    }

    /// Replays the changes made meanwhile into `built` and puts it in service, whole. The pending
    /// lock is held throughout, so no insert or removal can fall between the replay and the swap.
    fn finish(&self, built: HnswIndex) {
        self.install(built, Installed::Whole);
    }

    /// [`SwappableIndex::finish`], saying what `built` holds: as the dump on disk holds it stays
    /// true only if no change was made meanwhile.
    fn install(&self, built: HnswIndex, what: Installed) {
        let mut pending = lock(&self.pending);
        let changes = pending.take().unwrap_or_default();
        let unchanged = changes.is_empty();
        for change in changes {
            change.apply(&built);
        }
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(built);
        let version = self.version.fetch_add(1, Ordering::Relaxed) + 1;
        let on_disk = if what == Installed::AsDumped && unchanged {
            version
        } else {
            NOT_ON_DISK
        };
        self.on_disk.store(on_disk, Ordering::Relaxed);
        self.partial
            .store(what == Installed::Partial, Ordering::Relaxed);
    }

    /// Whether the index in service lacks entries the store could not be read for.
    pub fn is_partial(&self) -> bool {
        self.partial.load(Ordering::Relaxed)
    }

    /// After a change outside [`SwappableIndex::change`] (a partition's rebuild without its
    /// tombstones): the next save writes it.
    fn changed(&self) {
        let _pending = lock(&self.pending);
        self.version.fetch_add(1, Ordering::Relaxed);
    }
}

impl VectorIndex for SwappableIndex {
    fn insert(&self, id: u64, partition: [u8; 32], vector: &[f32]) {
        self.change(Change::Insert(id, partition, vector.to_vec()));
    }

    fn remove(&self, id: u64) {
        self.change(Change::Remove(id));
    }

    fn search(&self, partition: &[u8; 32], query: &[f32], k: usize) -> Vec<crate::index::Neighbor> {
        self.current().search(partition, query, k)
    }

    fn search_now(
        &self,
        partition: &[u8; 32],
        query: &[f32],
        k: usize,
        recheck_below: f32,
    ) -> Result<Vec<crate::index::Neighbor>, ScansBusy> {
        self.current()
            .search_now(partition, query, k, recheck_below)
    }

    fn scan_all(
        &self,
        query: &[f32],
        min_similarity: f32,
        k: usize,
    ) -> Vec<crate::index::Neighbor> {
        self.current().scan_all(query, min_similarity, k)
    }

    fn len(&self) -> usize {
        self.current().len()
    }

    fn tombstones(&self) -> usize {
        self.current().tombstones()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::faulty::FaultyReads;

    fn unit(seed: u32) -> Vec<f32> {
        let mut v: Vec<f32> = (0..8)
            .map(|i| ((seed * 31 + i * 7) % 13) as f32 - 6.0)
            .collect();
        let n = v
            .iter()
            .map(|x| x * x)
            .sum::<f32>()
            .sqrt()
            .max(f32::EPSILON);
        v.iter_mut().for_each(|x| *x /= n);
        v
    }

    /// Retries of whole-store reads, without the waits.
    const QUICK: Patience = Patience {
        attempts: 3,
        first_wait: Duration::from_millis(1),
    };

    /// An entry in partition 1 with the prompt `question {n}`, a vector when `vector`.
    fn stored(n: u64, vector: bool) -> Entry {
        Entry {
            body: serde_json::json!({"choices": [{"message": {"content": "answer"}}]}),
            vector: vector.then(|| unit(n as u32)),
            ..Entry::for_test(
                &format!("question {n}"),
                *blake3::hash(&n.to_le_bytes()).as_bytes(),
            )
        }
    }

    #[test]
    fn start_up_reads_ids_then_streams_each_stored_vector_once_page_by_page() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::SledStore::open(dir.path()).expect("open");
        // More than two pages, every third entry without a vector.
        let n = 2 * PAGE as u64 + 7;
        let mut with_vector = BTreeSet::new();
        let mut without = Vec::new();
        for i in 0..n {
            let id = store.put(stored(i, i % 3 != 0)).expect("put").0;
            if i % 3 == 0 {
                without.push(id);
            } else {
                with_vector.insert(id);
            }
        }
        let (ids, unembedded) = stored_ids(&store, QUICK).expect("read");
        assert_eq!(ids, with_vector);
        assert_eq!(unembedded, without, "the backfill gets the rest");
        // Deleted after its id was read: skipped, not an error.
        let gone = *ids.iter().nth(PAGE + 1).expect("an id on the second page");
        assert!(store.delete(EntryId(gone)).expect("delete"));
        let streamed: Vec<(u64, [u8; 32], Vec<f32>)> =
            StoredVectors::new(&store, ids, QUICK).collect();
        let expected: Vec<u64> = with_vector
            .iter()
            .copied()
            .filter(|id| *id != gone)
            .collect();
        assert_eq!(streamed.iter().map(|s| s.0).collect::<Vec<_>>(), expected);
        for (id, partition, vector) in &streamed {
            let entry = store.get(EntryId(*id)).expect("get").expect("there");
            assert_eq!(
                (*partition, Some(vector.clone())),
                (entry.partition.0, entry.vector)
            );
        }
    }

    /// A sled store behind [`FaultyReads`] (read as Redis is: no ledger of ids) holding `n`
    /// entries, those whose number is `without` a vector stored without.
    fn faulty_store(
        dir: &Path,
        n: u64,
        without: impl Fn(u64) -> bool,
    ) -> Arc<FaultyReads<crate::store::SledStore>> {
        let store = FaultyReads::new(crate::store::SledStore::open(dir).expect("open"));
        for i in 0..n {
            store.put(stored(i, !without(i))).expect("put");
        }
        Arc::new(store)
    }

    /// Issue 22's last note: one failed read of the store cut the start's list of ids short, and
    /// the index built from it lacked the rest for good. A failed page is now read again, and
    /// one that keeps failing is an error, never a shorter list.
    #[test]
    fn whole_store_reads_retry_a_failed_page_and_report_one_that_keeps_failing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 2 * PAGE as u64 + 7;
        let store = faulty_store(dir.path(), n, |_| false);
        // The ids and then the first page failing once each: within patience.
        store.fail(1, 0);
        let (ids, _) = stored_ids(store.as_ref(), QUICK).expect("read whole");
        assert_eq!(ids.len() as u64, n);
        store.fail(2, 1);
        assert_eq!(stored_ids(store.as_ref(), QUICK).expect("whole").0, ids);
        // The second page failing as often as the patience tries: an error.
        store.fail(3, 2);
        assert!(stored_ids(store.as_ref(), QUICK).is_err());

        store.fail(2, 1);
        let mut vectors = StoredVectors::new(store.as_ref(), ids.clone(), QUICK);
        assert_eq!((&mut vectors).count() as u64, n);
        assert!(vectors.finish().0.is_none());
        store.fail(3, 1);
        let mut vectors = StoredVectors::new(store.as_ref(), ids, QUICK);
        assert_eq!((&mut vectors).count(), PAGE, "the first page only");
        assert!(vectors.finish().0.is_some(), "and says why it ended");
    }

    #[test]
    fn a_rebuild_that_cannot_read_the_store_whole_keeps_the_larger_index_until_one_can() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 2 * PAGE as u64 + 7;
        let store = faulty_store(dir.path(), n, |_| false);
        let index = SwappableIndex::ready(HnswIndex::new(index_config(8)));
        // The ids, then the build's first page of vectors but not its second (the build reads
        // each entry once: a store without a ledger is not read to list them first): half an
        // index beats none.
        store.fail(3, 2);
        let rebuilt = index.rebuild(store.as_ref(), 8, QUICK);
        assert!(matches!(rebuilt, Rebuild::Incomplete(_)), "{rebuilt:?}");
        assert_eq!(index.len(), PAGE);
        assert!(!index.is_building(), "the next rebuild may start");
        assert!(index.is_partial(), "and it is not saved");
        // Not even the ids: the larger index stays.
        store.fail(3, 0);
        let rebuilt = index.rebuild(store.as_ref(), 8, QUICK);
        assert!(matches!(rebuilt, Rebuild::Incomplete(_)), "{rebuilt:?}");
        assert_eq!(index.len(), PAGE);
        let rebuilt = index.rebuild(store.as_ref(), 8, QUICK);
        assert!(
            matches!(rebuilt, Rebuild::Done(m) if m as u64 == n),
            "{rebuilt:?}"
        );
        assert_eq!(index.len() as u64, n);
        assert!(!index.is_partial());
    }

    /// A rebuild from the store puts every vector in service as soon as the store is read: a
    /// partition past `brute_force_below` is searched flat until the maintenance gives it its
    /// graph (half an hour of both cores at a million vectors).
    #[test]
    fn a_rebuild_serves_every_stored_vector_before_the_graphs_are_built() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = crate::store::SledStore::open(dir.path()).expect("open");
        let n = index_config(8).brute_force_below as u64 + 5;
        let partition = stored(0, true).partition.0;
        for i in 0..n {
            store.put(stored(i, true)).expect("put");
        }
        let index = SwappableIndex::ready(HnswIndex::new(index_config(8)));
        let rebuilt = index.rebuild(&store, 8, QUICK);
        assert!(
            matches!(rebuilt, Rebuild::Done(m) if m as u64 == n),
            "{rebuilt:?}"
        );
        assert!(!index.is_building(), "in service with every vector");
        assert_eq!(index.current().graphs_pending(), 1);
        let found = index
            .search_now(&partition, &unit(7), 2, 0.9)
            .expect("a permit");
        assert_eq!(found.len(), 2);
        assert!(found[0].similarity > 0.999, "{found:?}");
        // A resync while the graphs are still to build: flat again, at once.
        let rebuilt = index.rebuild(&store, 8, QUICK);
        assert!(matches!(rebuilt, Rebuild::Done(_)), "{rebuilt:?}");
        assert_eq!(index.current().graphs_pending(), 1);
        // Once the maintenance built the graph, a resync's replacement comes with its own, built
        // while the one in service serves.
        assert!(index.current().maybe_rebuild());
        assert_eq!(index.current().graphs_pending(), 0);
        let rebuilt = index.rebuild(&store, 8, QUICK);
        assert!(matches!(rebuilt, Rebuild::Done(_)), "{rebuilt:?}");
        assert_eq!(index.current().graphs_pending(), 0);
        assert_eq!(index.len() as u64, n);
    }

    /// The gateway's store is a `ResilientStore`, which reads as empty while degraded: a read of
    /// the whole store must fail instead, or a Redis down at start (or during a resync) makes an
    /// empty index pass for the whole one, and its dump replace the good one.
    #[test]
    fn a_degraded_store_is_no_store_without_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let down = crate::store::ResilientStore::unavailable(dir.path(), &StoreError::Unavailable);
        assert!(stored_ids(&down, QUICK).is_err());
        let index = SwappableIndex::ready(HnswIndex::build(
            index_config(8),
            (1..=3)
                .map(|i| (i, [1; 32], unit(i as u32)))
                .collect::<Vec<_>>(),
        ));
        let rebuilt = index.rebuild(&down, 8, QUICK);
        assert!(matches!(rebuilt, Rebuild::Incomplete(_)), "{rebuilt:?}");
        assert_eq!(index.len(), 3, "the index in service stays");
        assert!(!index.is_partial());
    }

    /// A partial index serves, but is never saved over the dump: the next start would find the
    /// dump far behind and rebuild everything.
    #[test]
    fn a_partial_index_is_not_saved() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = || HnswIndex::build(index_config(8), vec![(1, [1; 32], unit(1))]);
        let live = SwappableIndex::building(HnswIndex::new(index_config(8)));
        live.install(one(), Installed::Partial);
        assert!(live.is_partial() && !live.is_building());
        assert!(!live.save(dir.path()).expect("save"));
        assert!(HnswIndex::dump_summary(dir.path()).is_none());
        assert!(live.begin_rebuild());
        live.finish(one());
        assert!(!live.is_partial());
        assert!(live.save(dir.path()).expect("save"));
    }

    /// A unit vector per text, of 8 dimensions.
    struct Hashed;

    impl crate::embed::EmbedModel for Hashed {
        fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
            Ok(texts
                .iter()
                .map(|t| unit(blake3::hash(t.as_bytes()).as_bytes()[0].into()))
                .collect())
        }

        fn dimension(&self) -> usize {
            8
        }
    }

    /// The semantic stage over `store` with the [`Hashed`] model, once the start's read of the
    /// (empty) store has put an empty index in service.
    async fn started(dir: &Path, store: &Arc<dyn Store>) -> Arc<Semantic> {
        let embedder = Arc::new(
            Embedder::with_model(Box::new(Hashed), &crate::embed::EmbedConfig::default())
                .expect("fake"),
        );
        let config = crate::config::Config {
            data_dir: dir.to_owned(),
            ..crate::config::Config::default()
        };
        let Status::Ready(semantic) = Semantic::start(&config, store, Some(embedder), None) else {
            panic!("semantic stage did not start");
        };
        while semantic.index.is_building() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        semantic
    }

    /// A candidate whose replay is gone (one half of it evicted or unreadable) is never served:
    /// the search drops it from the index and serves the next candidate above the threshold, with
    /// that candidate's replay.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_candidate_without_its_replay_is_dropped_and_the_next_one_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let faulty = Arc::new(FaultyReads::new(
            crate::store::SledStore::open(dir.path()).expect("store"),
        ));
        let store: Arc<dyn Store> = faulty.clone();
        let semantic = started(dir.path(), &store).await;
        let nearest = store.put(stored(7, true)).expect("put");
        let next = store.put(stored(8, true)).expect("put");
        let partition = stored(7, true).partition.0;
        // The next candidate: the query's vector turned a little (similarity about 0.99).
        let mut turned = unit(7);
        turned[0] += 0.1;
        let norm = turned.iter().map(|x| x * x).sum::<f32>().sqrt();
        turned.iter_mut().for_each(|x| *x /= norm);
        let flat = HnswIndex::build_flat(
            index_config(8),
            [(nearest.0, partition, unit(7)), (next.0, partition, turned)],
        );
        assert!(semantic.index.begin_rebuild());
        semantic.index.install(flat, Installed::Whole);
        let query = Query {
            partition,
            prompt: "question 7".into(),
            threshold: 0.9,
            serve_at: 0.9,
            guards: Guards::default(),
            max_age_s: None,
        };
        faulty.lose_replay(nearest);
        let outcome = semantic.search(&store, unit(7), query).await;
        let hit = outcome.hit.expect("the next candidate served");
        assert_eq!(hit.entry.id, next);
        assert!(hit.similarity >= 0.9 && hit.similarity < 0.999);
        assert_eq!(hit.replay.id(), next);
        assert_eq!(outcome.nearest_entry, Some(nearest));
        let ids = semantic.index.current().ids();
        assert!(!ids.contains(&nearest.0) && ids.contains(&next.0));
        semantic.stop();
    }

    /// While a large partition awaits its graph, its lookups search it by its rows' sketches,
    /// which need no scan permit: with every permit held they still hit. Scanned exactly (the
    /// sketches off), a lookup that finds every core scanning goes on at once without semantic
    /// matching, counted as `scan_busy`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lookup_that_finds_every_scan_busy_falls_back_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SledStore::open(dir.path()).expect("store"));
        let semantic = started(dir.path(), &store).await;
        let id = store.put(stored(7, true)).expect("put").0;
        let partition = stored(7, true).partition.0;
        // Flat, as a rebuild from the store leaves it, and large enough to be scanned in parallel
        // chunks (the maintenance's first tick, which would give it a graph, is seconds away).
        let flat = |recheck_below| {
            let filler = (1..40_000u64).map(|n| {
                let bytes = blake3::hash(&n.to_le_bytes());
                let v: Vec<f32> = bytes.as_bytes()[..8]
                    .iter()
                    .map(|b| f32::from(*b) - 127.5)
                    .collect();
                (id + n, partition, v)
            });
            HnswIndex::build_flat(
                IndexConfig {
                    brute_force_below: 1_000,
                    recheck_below,
                    ..index_config(8)
                },
                std::iter::once((id, partition, unit(7))).chain(filler),
            )
        };
        let query = || Query {
            partition,
            prompt: "question 7".into(),
            threshold: 0.9,
            serve_at: 0.9,
            guards: Guards::default(),
            max_age_s: None,
        };
        for (recheck_below, skipped) in [(index_config(8).recheck_below, 0), (-2.0, 1)] {
            assert!(semantic.index.begin_rebuild());
            semantic
                .index
                .install(flat(recheck_below), Installed::Whole);
            let index = semantic.index.current();
            assert_eq!(index.graphs_pending(), 1);
            let held = index.hold_every_scan();
            let outcome = semantic.search(&store, unit(7), query()).await;
            if skipped == 0 {
                assert_eq!(outcome.skipped, None, "by its sketches");
                assert_eq!(outcome.hit.map(|hit| hit.entry.id.0), Some(id));
            } else {
                assert_eq!(outcome.skipped, Some(FallbackReason::ScanBusy));
                assert!(outcome.hit.is_none() && outcome.nearest.is_none());
            }
            assert_eq!(
                (
                    semantic.fallbacks().scan_busy,
                    semantic.fallbacks().overload
                ),
                (skipped, 0)
            );
            drop(held);
            let outcome = semantic.search(&store, unit(7), query()).await;
            assert_eq!(outcome.skipped, None);
            assert_eq!(outcome.hit.map(|hit| hit.entry.id.0), Some(id));
            assert_eq!(semantic.fallbacks().scan_busy, skipped);
        }
        semantic.stop();
    }

    /// A dump that could not be checked against the store (its read failed) is loaded again once
    /// the store reads, not thrown away for a rebuild (34 minutes at a million vectors).
    #[test]
    fn a_dump_unchecked_for_a_failing_store_is_loaded_once_it_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 2 * PAGE as u64 + 7;
        let faulty = faulty_store(&dir.path().join("db"), n, |_| false);
        let store: Arc<dyn Store> = faulty.clone();
        let dump = dir.path().join("index");
        let (ids, _) = stored_ids(store.as_ref(), QUICK).expect("read");
        let (built, failed, _) = build_from_store(store.as_ref(), 8, ids, QUICK, Graphs::Now);
        assert!(failed.is_none());
        built.save(&dump).expect("save");
        let embedder = Arc::new(
            Embedder::with_model(Box::new(Hashed), &EmbedConfig::default()).expect("fake"),
        );
        // The ids and the sample that lets the dump's ids go unread; then the load's own check
        // of a sample fails past patience.
        faulty.fail(3, 2);
        let index = SwappableIndex::building(HnswIndex::new(index_config(8)));
        let backfill = Backfill::start(embedder, index.clone(), store.clone(), vec![]);
        load_in_background(&dump, 8, &store, None, &index, &backfill, QUICK);
        let started = std::time::Instant::now();
        while index.is_building() {
            assert!(started.elapsed() < Duration::from_secs(60), "never loaded");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(index.from_dump(), "loaded, not rebuilt");
        assert_eq!(index.len() as u64, n);
        assert_eq!(faulty.failures.load(Ordering::SeqCst), 0);
        // And as the dump holds it: nothing to write.
        assert!(!index.save(&dump).expect("save"));
        backfill.stop();
    }

    /// The start's load, with the store failing: its ids first, then a page of its vectors. The
    /// index is whole once the store reads, and the entries without a vector are embedded.
    #[test]
    fn the_start_waits_for_a_failing_store_and_retries_until_the_index_is_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 2 * PAGE as u64 + 7;
        let faulty = faulty_store(&dir.path().join("db"), n, |i| i % 5 == 0);
        let store: Arc<dyn Store> = faulty.clone();
        let embedder = Arc::new(
            Embedder::with_model(Box::new(Hashed), &EmbedConfig::default()).expect("fake"),
        );
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let started = std::time::Instant::now();
            while !done() {
                assert!(started.elapsed() < Duration::from_secs(60), "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // With the ids and the build's first page read, its second page failing past patience:
        // the entries without a vector are found by the build (there is no dump to vouch for
        // any), those of the unread pages by the rebuild that follows; then the ids failing past
        // patience once.
        for (failures, good_reads, to_embed) in [(3, 2, n.div_ceil(5)), (4, 0, 0)] {
            faulty.fail(failures, good_reads);
            let index = SwappableIndex::building(HnswIndex::new(index_config(8)));
            let backfill = Backfill::start(embedder.clone(), index.clone(), store.clone(), vec![]);
            let no_dump = dir.path().join("index");
            load_in_background(&no_dump, 8, &store, None, &index, &backfill, QUICK);
            until("the whole index", &|| {
                !index.is_building() && index.len() as u64 == n
            });
            assert_eq!(faulty.failures.load(Ordering::SeqCst), 0);
            // Those without a vector were found and embedded (in the first round), all of them.
            until("the backfill", &|| backfill.stats().pending == 0);
            assert_eq!(backfill.stats().embedded, to_embed);
            backfill.stop();
            let entries = store.list(None, n as usize).expect("list");
            assert!(entries.iter().all(|e| e.vector.is_some()));
        }
    }

    /// A store without a ledger of which entries have a vector (Redis) had every entry's cold
    /// half read at start to learn it, a minute at a million entries, when the replica's own dump
    /// already held nearly all of them. Those the dump holds are now taken from it once a sample
    /// matches the store; only the entries stored since are read.
    #[test]
    fn a_store_without_a_ledger_reads_only_the_entries_its_dump_lacks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 3 * PAGE as u64;
        let faulty = faulty_store(&dir.path().join("db"), n, |_| false);
        let store: Arc<dyn Store> = faulty.clone();
        let dump = dir.path().join("index");
        let (ids, _) = stored_ids(store.as_ref(), QUICK).expect("read");
        let (built, failed, _) =
            build_from_store(store.as_ref(), 8, ids.clone(), QUICK, Graphs::Now);
        assert!(failed.is_none());
        built.save(&dump).expect("save");
        // Since the dump: one entry deleted, ten stored with a vector and five without.
        let first = *ids.first().expect("ids");
        assert!(store.delete(EntryId(first)).expect("delete"));
        let added: Vec<u64> = (n..n + 15)
            .map(|i| store.put(stored(i, i < n + 10)).expect("put").0)
            .collect();
        let (all, unembedded) = stored_ids(store.as_ref(), QUICK).expect("read");
        assert_eq!(all.len() as u64, n - 1 + 10);
        assert_eq!(unembedded, added[10..].to_vec());

        faulty.cold_asked.store(0, Ordering::SeqCst);
        let mut preloaded = None;
        let dumped = |stored: &[EntryId]| {
            dumped_ids(&dump, 8, store.as_ref(), stored, &mut preloaded, QUICK)
        };
        let trusted =
            stored_ids_trusting(store.as_ref(), QUICK, dumped, Unvouched::Read).expect("read");
        assert_eq!(trusted, (all.clone(), unembedded.clone()));
        let asked = faulty.cold_asked.load(Ordering::SeqCst);
        assert!(
            asked <= PAGE + 15,
            "a sample and the 15 new entries, not all {n}: {asked}"
        );
        // The dump was loaded for it, and is then brought up to the store as before.
        assert!(matches!(preloaded, Some(Ok(_))));
        let (index, caught_up) =
            load_dump(&dump, 8, &store, &trusted.0, preloaded, QUICK).expect("caught up");
        assert_eq!((caught_up.added, caught_up.removed), (10, 1));
        assert_eq!(index.ids(), all);

        // A dump of another store (the same ids, other vectors) is not trusted: every entry is
        // read, and the ids are still right.
        let other = dir.path().join("other");
        let opposite = StoredVectors::new(store.as_ref(), all.clone(), QUICK)
            .map(|(id, partition, v)| (id, partition, v.iter().map(|x| -x).collect()));
        HnswIndex::build(index_config(8), opposite.collect::<Vec<_>>())
            .save(&other)
            .expect("save");
        faulty.cold_asked.store(0, Ordering::SeqCst);
        let mut preloaded = None;
        let dumped = |stored: &[EntryId]| {
            dumped_ids(&other, 8, store.as_ref(), stored, &mut preloaded, QUICK)
        };
        let read =
            stored_ids_trusting(store.as_ref(), QUICK, dumped, Unvouched::Read).expect("read");
        assert_eq!(read, (all, unembedded));
        assert!(faulty.cold_asked.load(Ordering::SeqCst) as u64 >= n + 15 - 1);
        // No dump at all: every entry is read, and nothing is loaded.
        let mut preloaded = None;
        let none = dir.path().join("none");
        let mut dumped = |stored: &[EntryId]| {
            dumped_ids(&none, 8, store.as_ref(), stored, &mut preloaded, QUICK)
        };
        assert!(dumped(&[EntryId(first + 1)]).is_none());
        assert!(preloaded.is_none());
    }

    /// A fresh replica of a store without a ledger (Redis), with no dump to vouch for any entry,
    /// read every entry's cold half twice: once to list those with a vector, once to build. The
    /// listing now leaves them unread; the build reads each once, skips those without a vector and
    /// names those that want one, for the backfill.
    #[test]
    fn a_store_without_a_ledger_is_read_once_when_no_dump_vouches_for_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 3 * PAGE as u64;
        let faulty = faulty_store(dir.path(), n, |i| i % 7 == 0);
        let store: Arc<dyn Store> = faulty.clone();
        let (with_vector, unembedded) = stored_ids(store.as_ref(), QUICK).expect("read");
        assert!(!unembedded.is_empty());
        faulty.cold_asked.store(0, Ordering::SeqCst);
        let none = |_: &[EntryId]| None;
        let (listed, found) =
            stored_ids_trusting(store.as_ref(), QUICK, none, Unvouched::LeftToTheBuild)
                .expect("list");
        assert_eq!(faulty.cold_asked.load(Ordering::SeqCst), 0);
        assert_eq!((listed.len() as u64, found.len()), (n, 0));
        let (built, failed, found) =
            build_from_store(store.as_ref(), 8, listed, QUICK, Graphs::Now);
        assert!(failed.is_none());
        assert_eq!(built.ids(), with_vector);
        assert_eq!(found, unembedded);
        assert_eq!(faulty.cold_asked.load(Ordering::SeqCst) as u64, n);
        // A dump caught up from such a list skips the entries without a vector in the same way.
        let dump = dir.path().join("index");
        let some: BTreeSet<u64> = with_vector.iter().copied().skip(10).collect();
        build_from_store(store.as_ref(), 8, some, QUICK, Graphs::Now)
            .0
            .save(&dump)
            .expect("save");
        let all: BTreeSet<u64> = with_vector.iter().chain(&unembedded).copied().collect();
        let (index, caught_up) = load_dump(&dump, 8, &store, &all, None, QUICK).expect("loaded");
        assert_eq!(index.ids(), with_vector);
        assert_eq!(caught_up.unembedded, unembedded);
    }

    /// A dump that only looks far behind by its count, because most entries of a store without a
    /// ledger never get a vector, is still loaded: those entries are read to list the vectors
    /// (not left to the build, which would rebuild the index), and the dump then matches.
    #[test]
    fn a_dump_that_only_looks_far_behind_has_its_entries_read_and_is_loaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let n = 3 * PAGE as u64;
        let faulty = faulty_store(&dir.path().join("db"), n, |i| i % 3 != 0);
        let store: Arc<dyn Store> = faulty.clone();
        let (with_vector, _) = stored_ids(store.as_ref(), QUICK).expect("read");
        let dump = dir.path().join("index");
        build_from_store(store.as_ref(), 8, with_vector.clone(), QUICK, Graphs::Now)
            .0
            .save(&dump)
            .expect("save");
        let mut preloaded = None;
        let dumped = |stored: &[EntryId]| {
            dumped_ids(&dump, 8, store.as_ref(), stored, &mut preloaded, QUICK)
        };
        let (expected, _) =
            stored_ids_trusting(store.as_ref(), QUICK, dumped, Unvouched::LeftToTheBuild)
                .expect("read");
        assert_eq!(expected, with_vector, "read, not left to the build");
        let (index, caught_up) =
            load_dump(&dump, 8, &store, &expected, preloaded, QUICK).expect("loaded");
        assert_eq!((caught_up.added, caught_up.removed), (0, 0));
        assert_eq!(index.ids(), with_vector);
    }

    #[test]
    fn a_dump_is_brought_up_to_the_store_unless_it_was_another_stores() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SledStore::open(&dir.path().join("db")).expect("open"));
        let ids: Vec<u64> = (0..6)
            .map(|i| store.put(stored(i, true)).expect("put").0)
            .collect();
        // Saved when the store held the first four; since, the last two were stored and the
        // first deleted.
        let saved = dir.path().join("index");
        let vectors =
            |ids: &[u64]| StoredVectors::new(store.as_ref(), ids.iter().copied().collect(), QUICK);
        HnswIndex::build(index_config(8), vectors(&ids[..4]))
            .save(&saved)
            .expect("save");
        assert!(store.delete(EntryId(ids[0])).expect("delete"));
        let (expected, _) = stored_ids(store.as_ref(), QUICK).expect("read");
        assert_eq!(expected, ids[1..].iter().copied().collect());
        // Loaded as the gateway does, started before the store's ids were read.
        let preload = DumpPreload::start(&Config {
            data_dir: dir.path().to_owned(),
            ..Config::default()
        });
        assert!(preload.is_some(), "a dump to preload");
        let (index, caught_up) = load_dump(
            &saved,
            8,
            &store,
            &expected,
            preload.map(DumpPreload::join),
            QUICK,
        )
        .expect("caught up");
        assert_eq!((caught_up.added, caught_up.removed), (2, 1));
        assert_eq!(index.ids(), expected);
        let newest = store.get(EntryId(ids[5])).expect("get").expect("there");
        let vector = newest.vector.expect("vector");
        assert_eq!(index.search(&newest.partition.0, &vector, 1)[0].id, ids[5]);

        // Should a list of the store's ids lack one (a scan cut short), an entry the dump has and
        // the store still holds stays, whatever the list says.
        let mut cut_short = expected.clone();
        cut_short.remove(&ids[2]);
        let (index, caught_up) =
            load_dump(&saved, 8, &store, &cut_short, None, QUICK).expect("caught up");
        assert_eq!((caught_up.added, caught_up.removed), (2, 1));
        assert_eq!(index.ids(), expected);

        // Far behind the store by its manifest's count alone: refused before anything else of
        // it is read (here there is nothing else).
        let behind = dir.path().join("behind");
        HnswIndex::new(index_config(8)).save(&behind).expect("save");
        for file in std::fs::read_dir(&behind).expect("list") {
            let path = file.expect("entry").path();
            if path.file_name() != Some(std::ffi::OsStr::new("manifest.json")) {
                std::fs::remove_file(path).expect("rm");
            }
        }
        let many: BTreeSet<u64> = (1..=4 * PAGE as u64).collect();
        let refused = load_dump(&behind, 8, &store, &many, None, QUICK);
        if crate::priority::cores() > 1 {
            assert!(
                matches!(refused, Err(DumpUnused::FarBehind { stored, .. }) if stored == many.len())
            );
        } else {
            // On one core a rebuild is no quicker than adding them: the dump is read (and found
            // incomplete here).
            assert!(matches!(refused, Err(DumpUnused::Unreadable(_))));
        }

        // A dump of vectors of another dimension (another model's) loads early at its own, and
        // is refused once the model's is known.
        let elsewhere = tempfile::tempdir().expect("tempdir");
        HnswIndex::build(
            index_config(4),
            [(ids[1], [1; 32], vec![1.0, 0.0, 0.0, 0.0])],
        )
        .save(&elsewhere.path().join("index"))
        .expect("save");
        let preload = DumpPreload::start(&Config {
            data_dir: elsewhere.path().to_owned(),
            ..Config::default()
        });
        assert!(matches!(
            load_dump(
                &saved,
                8,
                &store,
                &expected,
                preload.map(DumpPreload::join),
                QUICK
            ),
            Err(DumpUnused::Unreadable(IndexError::Dimension {
                expected: 8,
                found: 4
            }))
        ));

        // The same ids with other vectors: a dump of another store, rebuilt from this one.
        let other = dir.path().join("other");
        let opposite = vectors(&ids[1..])
            .map(|(id, partition, v)| (id, partition, v.iter().map(|x| -x).collect()));
        HnswIndex::build(index_config(8), opposite.collect::<Vec<_>>())
            .save(&other)
            .expect("save");
        assert!(matches!(
            load_dump(&other, 8, &store, &expected, None, QUICK),
            Err(DumpUnused::OtherStore { .. })
        ));
    }

    #[test]
    fn changes_made_while_a_dump_is_written_wait_for_it_in_order() {
        let config = || IndexConfig::new(8);
        let ids = |live: &SwappableIndex| live.current().ids().into_iter().collect::<Vec<_>>();
        let live = SwappableIndex::ready(HnswIndex::build(
            config(),
            (1..=3)
                .map(|i| (i, [1; 32], unit(i as u32)))
                .collect::<Vec<_>>(),
        ));
        let deferring = live.defer_changes().expect("no rebuild running");
        // The index being written is left alone: no insert waits for its writer lock.
        live.insert(100, [1; 32], &unit(100));
        live.remove(2);
        live.remove(100);
        live.insert(101, [1; 32], &unit(101));
        assert_eq!(ids(&live), [1, 2, 3]);
        drop(deferring);
        // Applied in the order made: 100 inserted then removed.
        assert_eq!(ids(&live), [1, 3, 101]);
        live.insert(102, [1; 32], &unit(102));
        assert_eq!(
            ids(&live),
            [1, 3, 101, 102],
            "straight in once the dump is written"
        );

        // A dump that panics still ends the deferral: what was kept is applied, and what comes
        // after reaches the index directly instead of piling up in the list for good.
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _deferring = live.defer_changes().expect("no rebuild running");
            live.remove(1);
            panic!("the dump failed");
        }));
        assert!(panicked.is_err());
        assert_eq!(ids(&live), [3, 101, 102]);
        live.insert(103, [1; 32], &unit(103));
        assert_eq!(ids(&live), [3, 101, 102, 103]);

        // No dump of a graph a rebuild is about to replace.
        assert!(live.begin_rebuild());
        assert!(live.defer_changes().is_none());
    }

    /// A dump is 1.5 GB at a million vectors, once written at every shutdown whatever changed.
    #[test]
    fn a_save_writes_only_what_the_dump_on_disk_does_not_hold() {
        let dir = tempfile::tempdir().expect("tempdir");
        let generation = || {
            let manifest = std::fs::read(dir.path().join("manifest.json")).ok()?;
            serde_json::from_slice::<serde_json::Value>(&manifest).ok()?["generation"].as_u64()
        };
        let built = || {
            HnswIndex::build(
                IndexConfig::new(8),
                (1..=3)
                    .map(|i| (i, [1; 32], unit(i as u32)))
                    .collect::<Vec<_>>(),
            )
        };
        let live = SwappableIndex::building(HnswIndex::new(IndexConfig::new(8)));
        assert!(!live.save(dir.path()).expect("save"), "not while building");
        live.finish(built());
        assert!(live.save(dir.path()).expect("save"), "a rebuilt index");
        assert!(!live.save(dir.path()).expect("save"), "nothing changed");
        assert_eq!(generation(), Some(1));
        live.remove(2);
        assert!(live.save(dir.path()).expect("save"));
        assert_eq!(generation(), Some(2));
        // A change made while a dump is written is not in it: the next save writes it.
        let deferring = live.defer_changes().expect("deferring");
        live.insert(4, [1; 32], &unit(4));
        drop(deferring);
        assert!(live.save(dir.path()).expect("save"));
        assert!(!live.save(dir.path()).expect("save"));
        assert_eq!(generation(), Some(3));

        // Loaded from the dump with nothing to catch up: already on disk.
        let loaded = SwappableIndex::building(HnswIndex::new(IndexConfig::new(8)));
        loaded.install(
            HnswIndex::load(dir.path(), IndexConfig::new(8)).expect("load"),
            Installed::AsDumped,
        );
        assert!(!loaded.save(dir.path()).expect("save"));
        // Not so when a change was made during the load: it is replayed into the loaded index.
        let loaded = SwappableIndex::building(HnswIndex::new(IndexConfig::new(8)));
        loaded.insert(5, [1; 32], &unit(5));
        loaded.install(
            HnswIndex::load(dir.path(), IndexConfig::new(8)).expect("load"),
            Installed::AsDumped,
        );
        assert!(loaded.save(dir.path()).expect("save"));
        assert_eq!(generation(), Some(4));
        loaded.changed();
        assert!(
            loaded.save(dir.path()).expect("save"),
            "a partition rebuilt"
        );
    }

    #[test]
    fn changes_made_during_a_rebuild_survive_the_swap() {
        let config = || IndexConfig::new(8);
        let live = SwappableIndex::building(HnswIndex::new(config()));
        assert!(live.is_building());
        // Served while the rebuild runs: a new entry, and a removal of a rebuilt one.
        live.insert(100, [1; 32], &unit(100));
        live.remove(2);
        let rebuilt = HnswIndex::build(
            config(),
            (1..=3)
                .map(|i| (i, [1; 32], unit(i as u32)))
                .collect::<Vec<_>>(),
        );
        live.finish(rebuilt);
        assert!(!live.is_building());
        let ids: BTreeSet<u64> = live
            .search(&[1; 32], &unit(100), 10)
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(ids, BTreeSet::from([1, 3, 100]));
        assert_eq!(live.len(), 3);
    }
}
