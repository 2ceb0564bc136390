//! The cache stages around the upstream: lookup (exact key, TTL, `max-age`), single flight for
//! concurrent identical misses, and recording (clean answers only, written off the request path).
//!
//! Writes and hit bookkeeping go through one writer thread, so a request never waits on the disk;
//! shutdown drains it and flushes the store, waiting no longer than it is given: a write stuck in
//! a failing disk must not hold the process (and the store's lock) past the grace period. While
//! the store is degraded, the writer also tries to bring it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::Notify;

use crate::backfill::Backfill;
use crate::entry::{Entry, EntryId, HitEvent, RequestSummary, StoredEvent, HIT_HISTORY};
use crate::index::VectorIndex;
use crate::ingress::Route;
use crate::key::{CacheKey, Keys};
use crate::policy::Policy;
use crate::record::unix_ms;
use crate::replay;
use crate::store::Store;
use crate::timing::Phases;

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
    pub sweep_interval_ms: u64,
}

enum WriteOp {
    Put(Box<Entry>),
    Flush(std::sync::mpsc::Sender<()>),
}

/// Hits noted since the writer last recorded them. A map behind a lock rather than a message per
/// hit: sending one woke the writer thread on every hit (a futex wake and a context switch, about a
/// tenth of the gateway's CPU under a hit storm), and the writer records them in batches anyway.
type PendingTouches = Arc<Mutex<HashMap<EntryId, Touches>>>;

/// A miss in progress that identical requests can join.
pub struct Flight {
    pub leader_streams: bool,
    /// Chunks the leader has received so far (streamed leaders only).
    chunks: Mutex<Vec<Value>>,
    /// `Some(Some(entry))` once stored, `Some(None)` when the answer could not be cached.
    done: Mutex<Option<Option<Arc<Entry>>>>,
    changed: Notify,
}

/// What a follower reads from a flight since its last look.
pub struct FlightUpdate {
    pub chunks: Vec<Value>,
    pub done: Option<Option<Arc<Entry>>>,
}

impl Flight {
    fn new(leader_streams: bool) -> Self {
        Self {
            leader_streams,
            chunks: Mutex::new(Vec::new()),
            done: Mutex::new(None),
            changed: Notify::new(),
        }
    }

    pub fn push(&self, chunk: Value) {
        lock(&self.chunks).push(chunk);
        self.changed.notify_waiters();
    }

    /// Chunks from `from` on, and the end if there is one; waits until there is something new.
    pub async fn next(&self, from: usize) -> FlightUpdate {
        loop {
            // Register interest before looking, so a push between the look and the wait is not lost.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let chunks: Vec<Value> = lock(&self.chunks)
                .get(from..)
                .map(<[Value]>::to_vec)
                .unwrap_or_default();
            let done = lock(&self.done).clone();
            if !chunks.is_empty() || done.is_some() {
                return FlightUpdate { chunks, done };
            }
            notified.await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The role of a request in single flight.
pub enum Join {
    Leader(Arc<Flight>),
    Follower(Arc<Flight>),
}

pub struct Cache {
    pub store: Arc<dyn Store>,
    /// The vector index new entries are added to, when semantic matching runs.
    pub index: Option<Arc<dyn VectorIndex>>,
    pub settings: CacheSettings,
    writer: Mutex<Option<std::sync::mpsc::Sender<WriteOp>>>,
    touches: PendingTouches,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Disconnects when the writer thread ends, so stopping it can wait with a deadline.
    writer_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    inflight: Mutex<HashMap<CacheKey, Arc<Flight>>>,
    aliases: Mutex<Aliases>,
}

/// How many paraphrases [`Aliases`] remembers.
const ALIASES: usize = 10_000;

/// Prompts recently served by a semantic hit, by their own exact key: a verbatim repeat of a
/// paraphrase (many users, one wording) then skips the embedding and the search. Only the entry id
/// and the similarity are kept, in memory; the entry is re-read and re-checked on every use, so a
/// deleted, replaced or expired entry is never served through an alias, and no alias carries a
/// vector that could chain paraphrases of paraphrases ever further from the stored prompt.
#[derive(Default)]
struct Aliases {
    map: HashMap<CacheKey, (EntryId, f32)>,
    order: std::collections::VecDeque<CacheKey>,
}
/// An exact hit: the entry's replay and how old it is.
pub struct ExactHit {
    pub replay: Arc<crate::entry::Replay>,
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
        let (tx, rx) = std::sync::mpsc::channel::<WriteOp>();
        let writer_store = store.clone();
        let writer_index = index.clone();
        let sweep = (
            settings.max_entries,
            settings.max_bytes,
            settings.sweep_interval_ms,
        );
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let touches = PendingTouches::default();
        let writer_touches = touches.clone();
        let thread = std::thread::Builder::new()
            .name("reprise-writer".into())
            .spawn(move || {
                // Dropped when the loop ends, however it ends.
                let _done = done_tx;
                writer_loop(
                    writer_store,
                    writer_index,
                    backfill,
                    rx,
                    &writer_touches,
                    sweep,
                );
            })
            .ok();
        Arc::new(Self {
            store,
            index,
            settings,
            writer: Mutex::new(Some(tx)),
            touches,
            writer_thread: Mutex::new(thread),
            writer_done: Mutex::new(Some(done_rx)),
            inflight: Mutex::new(HashMap::new()),
            aliases: Mutex::new(Aliases::default()),
        })
    }

    fn send(&self, op: WriteOp) {
        if let Some(tx) = lock(&self.writer).as_ref() {
            let _ = tx.send(op);
        }
    }

    /// The replay of an unexpired entry for `key` that satisfies `max-age`, if any: the hot read,
    /// which decodes nothing but what a hit sends.
    pub fn lookup(&self, key: &CacheKey, policy: &Policy) -> Option<ExactHit> {
        let entry = match self.store.replay_by_key(key) {
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
        let mut aliases = lock(&self.aliases);
        if aliases.map.insert(key, (id, similarity)).is_none() {
            aliases.order.push_back(key);
        }
        while aliases.map.len() > ALIASES {
            let Some(oldest) = aliases.order.pop_front() else {
                break;
            };
            aliases.map.remove(&oldest);
        }
    }

    /// The entry a paraphrase with exact key `key` was served before, if it still qualifies: live,
    /// in the request's partition, similar enough for today's `threshold`, young enough for
    /// `max-age`. Returns it with the similarity it was matched at.
    pub fn lookup_alias(
        &self,
        key: &CacheKey,
        partition: &crate::key::PartitionKey,
        threshold: f32,
        policy: &Policy,
    ) -> Option<(Hit, f32)> {
        let (id, similarity) = *lock(&self.aliases).map.get(key)?;
        if similarity < threshold {
            return None;
        }
        let entry = match self.store.get(id) {
            Ok(Some(e)) if e.partition == *partition => e,
            Ok(_) => {
                let mut aliases = lock(&self.aliases);
                if aliases.map.remove(key).is_some() {
                    aliases.order.retain(|k| k != key);
                }
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

    /// Records a hit on an entry (batched by the writer thread).
    pub fn note_hit(&self, id: EntryId, hit: HitEvent) {
        lock(&self.touches).entry(id).or_default().add(hit);
    }

    /// Joins the flight for `key`, or starts one when this request will store its answer.
    pub fn join(&self, key: CacheKey, leader_streams: bool, will_store: bool) -> Option<Join> {
        let mut inflight = lock(&self.inflight);
        if let Some(flight) = inflight.get(&key) {
            return Some(Join::Follower(flight.clone()));
        }
        if !will_store {
            return None;
        }
        let flight = Arc::new(Flight::new(leader_streams));
        inflight.insert(key, flight.clone());
        Some(Join::Leader(flight))
    }

    fn land(&self, key: &CacheKey, flight: &Arc<Flight>, outcome: Option<Arc<Entry>>) {
        let mut inflight = lock(&self.inflight);
        if inflight.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            inflight.remove(key);
        }
        drop(inflight);
        *lock(&flight.done) = Some(outcome);
        flight.changed.notify_waiters();
    }

    /// Waits until every write queued so far has landed (blocking; admin operations).
    pub fn drain(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(WriteOp::Flush(tx));
        let _ = rx.recv_timeout(std::time::Duration::from_secs(30));
    }

    /// Drains pending writes and flushes the store (shutdown), waiting at most `within`. Returns
    /// false when the writer did not finish in time (stuck on the disk): it is then left behind,
    /// and the process can exit without it.
    pub fn close(&self, within: std::time::Duration) -> bool {
        let deadline = Instant::now() + within;
        let (tx, rx) = std::sync::mpsc::channel();
        self.send(WriteOp::Flush(tx));
        let _ = rx.recv_timeout(within);
        self.stop_writer(deadline.saturating_duration_since(Instant::now()))
    }

    /// Ends the writer thread (it applies what is queued and flushes first); false if it has not
    /// ended within `within`.
    fn stop_writer(&self, within: std::time::Duration) -> bool {
        lock(&self.writer).take();
        let Some(done) = lock(&self.writer_done).take() else {
            return true;
        };
        match done.recv_timeout(within) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "the cache writer did not finish in time (a store write is stuck): exiting \
                     without it; writes still queued are lost"
                );
                false
            }
            _ => {
                if let Some(thread) = lock(&self.writer_thread).take() {
                    let _ = thread.join();
                }
                true
            }
        }
    }
}

/// How long a cache dropped without `close` waits for its writer.
const DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Cache {
    fn drop(&mut self) {
        // A cache dropped without `close` (a test, an early exit) still stops its writer, which
        // would otherwise keep the store, and its file lock, alive.
        self.stop_writer(DROP_WAIT);
    }
}

fn writer_loop(
    store: Arc<dyn Store>,
    index: Option<Arc<dyn VectorIndex>>,
    backfill: Option<Arc<Backfill>>,
    rx: std::sync::mpsc::Receiver<WriteOp>,
    pending: &Mutex<HashMap<EntryId, Touches>>,
    (max_entries, max_bytes, sweep_ms): (usize, u64, u64),
) {
    let interval = std::time::Duration::from_millis(sweep_ms.max(10));
    let mut last_sweep = Instant::now();
    // Takes the hits noted so far, leaving the lock at once.
    let take = || std::mem::take(&mut *lock(pending));
    let mut dirty = false;
    loop {
        let op = rx.recv_timeout(interval);
        match op {
            Ok(WriteOp::Put(entry)) => {
                let vector = entry.vector.clone().map(|v| (entry.partition.0, v));
                let unembedded = crate::backfill::wants_vector(&entry);
                match store.put(*entry) {
                    // The index learns of an entry only once the store holds it.
                    Ok(id) => {
                        if let (Some(index), Some((partition, vector))) = (&index, vector) {
                            index.insert(id.0, partition, &vector);
                        }
                        // Its miss skipped the embedding: the vector comes later, off this path.
                        if let Some(backfill) = backfill.as_ref().filter(|_| unembedded) {
                            backfill.enqueue(id);
                        }
                    }
                    // At debug: a failing store logs its state once, not once per answer.
                    Err(err) => tracing::debug!(error = %err, "storing a cache entry failed"),
                }
                dirty = true;
            }
            Ok(WriteOp::Flush(done)) => {
                apply_touches(store.as_ref(), &mut take());
                if let Err(err) = store.flush() {
                    tracing::debug!(error = %err, "flushing the store failed");
                }
                let _ = done.send(());
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                apply_touches(store.as_ref(), &mut take());
                let _ = store.flush();
                return;
            }
        }
        // Degraded (its disk failed): try to reopen it, busy or not; the store rate-limits this.
        if store.degraded().is_some() {
            store.recover();
        }
        // Hit counts are batched; TTL expiry and caps are enforced in the same quiet moments.
        if last_sweep.elapsed() >= interval || dirty && store.len() > max_entries {
            apply_touches(store.as_ref(), &mut take());
            match store.sweep(unix_ms(), max_entries, max_bytes) {
                Ok((expired, evicted)) if expired + evicted > 0 => {
                    tracing::debug!(expired, evicted, "cache sweep");
                }
                Ok(_) => {}
                Err(err) => tracing::debug!(error = %err, "cache sweep failed"),
            }
            // sled's log may hold far more than the live entries: rebuild it past its budget.
            store.enforce_disk_budget(max_bytes);
            last_sweep = Instant::now();
            dirty = false;
        }
    }
}

/// Hits on one entry since the last write of them.
#[derive(Default)]
struct Touches {
    count: u64,
    recent: std::collections::VecDeque<HitEvent>,
}

impl Touches {
    fn add(&mut self, hit: HitEvent) {
        self.count += 1;
        // Only the latest are kept with the entry: a hot entry's batch stays small.
        if self.recent.len() == HIT_HISTORY {
            self.recent.pop_front();
        }
        self.recent.push_back(hit);
    }
}

fn apply_touches(store: &dyn Store, touches: &mut HashMap<EntryId, Touches>) {
    for (id, t) in touches.drain() {
        let recent: Vec<HitEvent> = t.recent.into();
        if let Err(err) = store.touch(id, t.count, &recent) {
            tracing::debug!(error = %err, "recording hits failed");
        }
    }
}

/// Everything needed to turn a clean miss into an entry.
pub struct Recorder {
    pub cache: Arc<Cache>,
    pub route: Route,
    pub keys: Keys,
    pub summary: RequestSummary,
    pub ttl_s: u64,
    pub flight: Option<Arc<Flight>>,
    /// Chunks seen so far, with their arrival instants.
    events: Vec<(Instant, Value)>,
    /// Whether this answer may be stored (policy allowed it); a flight alone does not store.
    pub store: bool,
    /// The prompt's embedding, stored with the entry for semantic matching.
    pub vector: Option<Vec<f32>>,
    landed: bool,
}

impl Recorder {
    pub fn new(
        cache: Arc<Cache>,
        route: Route,
        keys: Keys,
        summary: RequestSummary,
        ttl_s: u64,
        flight: Option<Arc<Flight>>,
        store: bool,
    ) -> Self {
        Self {
            cache,
            route,
            keys,
            summary,
            ttl_s,
            flight,
            events: Vec::new(),
            store,
            vector: None,
            landed: false,
        }
    }

    /// Notes one stream chunk as it passes.
    pub fn chunk(&mut self, at: Instant, chunk: &Value) {
        if let Some(flight) = &self.flight {
            flight.push(chunk.clone());
        }
        self.events.push((at, chunk.clone()));
    }

    /// The stream ended cleanly: assemble, check and store it.
    pub fn finish_stream(mut self, phases: Phases) {
        let first = self.events.first().map(|(at, _)| *at);
        let events: Vec<StoredEvent> = std::mem::take(&mut self.events)
            .into_iter()
            .map(|(at, data)| StoredEvent {
                offset_ms: first.map_or(0.0, |f| {
                    crate::timing::millis(at.saturating_duration_since(f))
                }),
                data,
            })
            .collect();
        let chunks: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        let body = replay::assemble(self.route, &chunks);
        self.finish(body, events, phases);
    }

    /// A non-streamed 200 answer arrived whole.
    pub fn finish_body(self, raw: &[u8], phases: Phases) {
        let Ok(body) = serde_json::from_slice::<Value>(raw) else {
            tracing::debug!("not caching: the upstream body is not JSON");
            return self.abandon();
        };
        let events = if self.route == Route::Embeddings {
            Vec::new()
        } else {
            replay::rechunk(self.route, &body, phases.decode_ms.unwrap_or(0.0))
        };
        self.finish(body, events, phases);
    }

    fn finish(mut self, body: Value, events: Vec<StoredEvent>, phases: Phases) {
        if let Err(why) =
            replay::check_cacheable(self.route, &body, self.cache.settings.cache_length_finish)
        {
            tracing::debug!(?why, "not caching this answer");
            return self.abandon();
        }
        let now = unix_ms();
        let entry = Entry {
            id: EntryId(0),
            key: self.keys.exact,
            partition: self.keys.partition,
            summary: self.summary.clone(),
            events,
            usage: body.get("usage").filter(|u| !u.is_null()).cloned(),
            body,
            phases,
            created_at_ms: now,
            ttl_ms: self.ttl_s.saturating_mul(1000),
            hit_count: 0,
            last_hit_ms: 0,
            vector: self.vector.take(),
            hit_history: Vec::new(),
            warmed: false,
        };
        let entry = Arc::new(entry);
        if self.store {
            self.cache.send(WriteOp::Put(Box::new((*entry).clone())));
        }
        self.landed = true;
        if let Some(flight) = self.flight.take() {
            self.cache.land(&self.keys.exact, &flight, Some(entry));
        }
    }

    /// The answer will not be stored (failed, partial, or refused by the rules).
    pub fn abandon(mut self) {
        self.land_failed();
    }

    fn land_failed(&mut self) {
        if self.landed {
            return;
        }
        self.landed = true;
        if let Some(flight) = self.flight.take() {
            self.cache.land(&self.keys.exact, &flight, None);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A recorder dropped without a verdict (a panic, a cancelled task) must not strand followers.
        self.land_failed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use std::time::Duration;

    /// A store whose flush never returns (until the test is long over): a write stuck in a
    /// failing disk.
    struct StuckStore;

    impl Store for StuckStore {
        fn get(&self, _: EntryId) -> Result<Option<Entry>, StoreError> {
            Ok(None)
        }
        fn replay_by_key(&self, _: &CacheKey) -> Result<Option<crate::entry::Replay>, StoreError> {
            Ok(None)
        }
        fn get_by_key(&self, _: &CacheKey) -> Result<Option<Entry>, StoreError> {
            Ok(None)
        }
        fn put(&self, _: Entry) -> Result<EntryId, StoreError> {
            Err(StoreError::Unavailable)
        }
        fn delete(&self, _: EntryId) -> Result<bool, StoreError> {
            Ok(false)
        }
        fn touch(&self, _: EntryId, _: u64, _: &[HitEvent]) -> Result<(), StoreError> {
            Ok(())
        }
        fn set_vector(&self, _: EntryId, _: &[f32]) -> Result<bool, StoreError> {
            Ok(false)
        }
        fn list_newest(&self, _: Option<EntryId>, _: usize) -> Result<Vec<Entry>, StoreError> {
            Ok(Vec::new())
        }
        fn list(&self, _: Option<EntryId>, _: usize) -> Result<Vec<Entry>, StoreError> {
            Ok(Vec::new())
        }
        fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
            Ok(Vec::new())
        }
        fn len(&self) -> usize {
            0
        }
        fn bytes(&self) -> u64 {
            0
        }
        fn sweep(&self, _: u64, _: usize, _: u64) -> Result<(usize, usize), StoreError> {
            Ok((0, 0))
        }
        fn flush(&self) -> Result<(), StoreError> {
            std::thread::sleep(Duration::from_secs(120));
            Ok(())
        }
        fn clear(&self) -> Result<usize, StoreError> {
            Ok(0)
        }
    }

    fn settings() -> CacheSettings {
        CacheSettings {
            share_across_keys: false,
            cache_length_finish: false,
            complete_on_disconnect: false,
            disconnect_budget_ms: 0,
            max_entries: 10,
            max_bytes: 1 << 20,
            sweep_interval_ms: 3_600_000,
        }
    }

    /// Before, `close` joined the writer thread without a deadline, so SIGTERM hung for as long
    /// as a store write did (forever, on the full disk).
    #[test]
    fn close_gives_up_on_a_writer_stuck_in_the_store() {
        let cache = Cache::new(Arc::new(StuckStore), None, None, settings());
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
