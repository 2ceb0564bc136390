//! The cache around the upstream, one concept per file: exact lookup (here), the alias memory of
//! paraphrases ([`alias`]), single flight for concurrent identical misses ([`flight`], and across
//! replicas sharing a store, [`remote`]), the recorder
//! that turns a clean miss into an entry ([`recorder`]) under each API's never-store rules (its adapter in [`crate::api`]),
//! and the writer thread that does every store write off the request path ([`writer`]).

pub mod alias;
pub mod flight;
pub mod recorder;
pub mod remote;
pub mod responses;
pub mod tape;
pub mod writer;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use flight::{Flight, FlightEnd, FlightUpdate, Join};
pub use recorder::Recorder;

use crate::backfill::Backfill;
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::index::VectorIndex;
use crate::key::{CacheKey, PartitionKey};
use crate::policy::Policy;
use crate::store::{Offload, Store};
use crate::timing::unix_ms;
use alias::Aliases;
use flight::Flights;
use writer::{Budget, Writer};

pub use crate::config::CacheSettings;

pub struct Cache {
    /// The store, for blocking threads only (the writer, admin work in `spawn_blocking`): async
    /// code reads it through [`Cache::read`].
    pub store: Arc<dyn Store>,
    /// Store calls from the request path, on blocking threads (bounded, with a deadline).
    calls: Offload,
    /// The vector index new entries are added to, when semantic matching runs.
    pub index: Option<Arc<dyn VectorIndex>>,
    pub settings: CacheSettings,
    writer: Writer,
    flights: Flights,
    aliases: Aliases,
    /// A stream asked for usage (`stream_options.include_usage`) came back without any: the
    /// upstream ignores it (some OpenAI-compatible servers do), so an entry without usage is no
    /// worse than what it would send, and is served (see `lookup::lacks_usage`).
    upstream_ignores_usage: AtomicBool,
}

/// An exact hit: the entry's replay and how old it is.
pub struct ExactHit {
    pub replay: Arc<Replay>,
    pub age_s: u64,
}

/// A found entry and how old it is.
pub struct Hit {
    pub entry: Arc<Entry>,
    pub age_s: u64,
}

impl Cache {
    /// `backfill` is told of every entry stored without a vector (semantic matching only).
    pub fn new(
        store: Arc<dyn Store>,
        index: Option<Arc<dyn VectorIndex>>,
        backfill: Option<Arc<Backfill>>,
        settings: CacheSettings,
    ) -> Arc<Self> {
        let budget = Budget {
            max_entries: settings.max_entries,
            max_bytes: settings.max_bytes,
            sweep_interval_ms: settings.sweep_interval_ms,
        };
        let flights = Flights::new(settings.max_entry_bytes);
        Arc::new(Self {
            writer: Writer::start(store.clone(), index.clone(), backfill, budget),
            calls: Offload::new(store.clone()),
            store,
            index,
            settings,
            flights,
            aliases: Aliases::default(),
            upstream_ignores_usage: AtomicBool::new(false),
        })
    }

    /// Whether a stream that asked for usage came back without it (since the start).
    pub fn upstream_ignores_usage(&self) -> bool {
        self.upstream_ignores_usage.load(Ordering::Relaxed)
    }

    /// A stream that asked for usage came back without it.
    pub(crate) fn note_usage_ignored(&self) {
        if !self.upstream_ignores_usage.swap(true, Ordering::Relaxed) {
            tracing::info!("the upstream sent no usage to a stream that asked for it (stream_options.include_usage): entries without usage now serve such streams as they are");
        }
    }

    /// Runs `op` on the store from async code: on a blocking thread, bounded in number and time
    /// (see [`Offload`]); `None` when it could not run in time, which callers take as a miss.
    pub async fn read<T, F>(&self, op: F) -> Option<T>
    where
        F: FnOnce(&dyn Store) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.calls.call(op).await
    }

    /// The store's error counts, with the calls from the request path given up at their deadline.
    pub fn store_errors(&self) -> crate::store::StoreErrors {
        crate::store::StoreErrors {
            timed_out: self.calls.timed_out(),
            ..self.store.errors()
        }
    }

    /// The replay of an unexpired entry for `key` that satisfies `max-age`, if any: the hot read,
    /// which decodes nothing but what a hit sends.
    pub async fn lookup(&self, key: &CacheKey, policy: &Policy) -> Option<ExactHit> {
        let key = *key;
        let entry = match self.read(move |store| store.replay_by_key(&key)).await? {
            Ok(found) => found?,
            Err(err) => {
                // Fail open: a store error is a miss, never an error to the client. The store logs
                // its own failures once; one line per request would flood the log.
                tracing::debug!(error = %err, "cache lookup failed; treating as a miss");
                return None;
            }
        };
        let now = unix_ms();
        if entry.is_expired(now) {
            return None;
        }
        let age_s = entry.age_s(now);
        if policy.max_age_s.is_some_and(|max| age_s > max) {
            return None;
        }
        Some(ExactHit {
            replay: Arc::new(entry),
            age_s,
        })
    }

    /// Remembers that the prompt with exact key `key` was served `id` at `similarity`.
    pub fn remember_alias(&self, key: CacheKey, id: EntryId, similarity: f32) {
        self.aliases.remember(key, id, similarity);
    }

    /// The entry a paraphrase with exact key `key` was served before, if it still qualifies: live,
    /// in the request's partition, similar enough for today's `threshold`, young enough for
    /// `max-age`. Returns it with the similarity it was matched at.
    pub async fn lookup_alias(
        &self,
        key: &CacheKey,
        partition: &PartitionKey,
        threshold: f32,
        policy: &Policy,
    ) -> Option<(Hit, f32)> {
        let (id, similarity) = self.aliases.get(key)?;
        if similarity < threshold {
            return None;
        }
        let entry = match self.read(move |store| store.get(id)).await? {
            Ok(Some(e)) if e.partition == *partition => e,
            Ok(_) => {
                self.aliases.forget(key);
                return None;
            }
            Err(_) => return None,
        };
        let now = unix_ms();
        let age_s = entry.age_s(now);
        if entry.is_expired(now) || policy.max_age_s.is_some_and(|max| age_s > max) {
            return None;
        }
        Some((
            Hit {
                entry: Arc::new(entry),
                age_s,
            },
            similarity,
        ))
    }

    /// Stores `entry` now, through the writer thread (so it never races the disk budget's rebuild
    /// of the store), and adds its vector to the index: for blocking threads that answer only once
    /// the entry is served (warming). `None` when the writer did not store it within `within`.
    pub fn store_now(
        &self,
        entry: crate::entry::Entry,
        within: Duration,
    ) -> Option<Result<EntryId, crate::store::StoreError>> {
        self.writer.put_now(entry, within)
    }

    /// Records a hit on an entry (batched by the writer thread).
    pub fn note_hit(&self, id: EntryId, hit: HitEvent) {
        self.writer.note_hit(id, hit);
    }

    /// Joins the flight for `key`, or starts one when this request will store its answer.
    pub fn join(&self, key: CacheKey, leader_streams: bool, will_store: bool) -> Option<Join> {
        self.flights.join(key, leader_streams, will_store)
    }

    /// Waits until every write queued so far has landed (blocking; admin operations).
    pub fn drain(&self) {
        self.writer.flush(Duration::from_secs(30));
    }

    /// Drains pending writes and flushes the store (shutdown), waiting at most `within`. Returns
    /// false when the writer did not finish in time (stuck on the disk): it is then left behind,
    /// and the process can exit without it.
    pub fn close(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        self.writer.flush(within);
        self.writer
            .stop(deadline.saturating_duration_since(Instant::now()))
    }
}

/// How long a cache dropped without `close` waits for its writer.
const DROP_WAIT: Duration = Duration::from_secs(10);

impl Drop for Cache {
    fn drop(&mut self) {
        // A cache dropped without `close` (a test, an early exit) still stops its writer, which
        // would otherwise keep the store, and its file lock, alive.
        self.writer.stop(DROP_WAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn settings() -> CacheSettings {
        CacheSettings {
            share_across_keys: false,
            cache_length_finish: false,
            complete_on_disconnect: false,
            disconnect_budget_ms: 0,
            max_entries: 10,
            max_bytes: 1 << 20,
            max_entry_bytes: 1 << 20,
            sweep_interval_ms: 3_600_000,
        }
    }

    /// Before, `close` joined the writer thread without a deadline, so SIGTERM hung for as long
    /// as a store write did (forever, on the full disk).
    #[test]
    fn close_gives_up_on_a_writer_stuck_in_the_store() {
        // A store whose flush never returns (until the test is long over): a write stuck in a
        // failing disk.
        let stuck = crate::store::stalled::StalledStore {
            flush: Duration::from_secs(120),
            ..Default::default()
        };
        let cache = Cache::new(Arc::new(stuck), None, None, settings());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let closed = cache.close(Duration::from_millis(300));
            // Dropping the cache must not wait for the writer either.
            drop(cache);
            let _ = tx.send(closed);
        });
        let closed = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("close and drop returned while the store was stuck");
        assert!(!closed, "close reports the writer it left behind");
    }
}
