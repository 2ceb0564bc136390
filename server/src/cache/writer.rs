//! The writer thread: every store write (new entries, hit bookkeeping, sweeps, the disk budget)
//! happens here, off the request path, so a request never waits on the disk.
//!
//! Shutdown drains it and flushes the store, waiting no longer than it is given: a write stuck in a
//! failing disk must not hold the process (and the store's lock) past the grace period. While the
//! store is degraded, the writer also tries to bring it back.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backfill::Backfill;
use crate::entry::{Entry, EntryId, HitEvent, StoredEvent, HIT_HISTORY};
use crate::index::VectorIndex;
use crate::key::CacheKey;
use crate::lock::lock;
use crate::store::{ClaimToken, Store, StoreError};
use crate::timing::unix_ms;

pub(super) enum WriteOp {
    Put(Box<Entry>),
    /// A streamed answer: the entry without its events, and the events as they were relayed
    /// (offset ms, bytes). Parsed here, one entry at a time, just before the write: a parsed event
    /// costs ten times its bytes, and entries queued with theirs added up while the disk was busy.
    PutRecorded(Box<Entry>, Vec<(f64, bytes::Bytes)>),
    Flush(mpsc::Sender<()>),
    /// An entry its sender waits for (`POST /admin/entries`: after the 201 the entry is served):
    /// stored here like any other, so it never races the disk budget's rebuild of the store.
    PutNow(Box<Entry>, mpsc::Sender<Result<EntryId, StoreError>>),
    /// Releases a replica-wide claim on a key (see [`super::remote`]): queued after the answer's
    /// `Put`, so that a replica waiting for the answer finds it stored once the claim is gone.
    Release(CacheKey, ClaimToken),
}

/// Hits noted since the writer last recorded them. A map behind a lock rather than a message per
/// hit: sending one woke the writer thread on every hit (a futex wake and a context switch, about a
/// tenth of the gateway's CPU under a hit storm), and the writer records them in batches anyway.
type PendingTouches = Arc<Mutex<HashMap<EntryId, Touches>>>;

/// When the writer sweeps and what it enforces.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub max_entries: usize,
    pub max_bytes: u64,
    pub sweep_interval_ms: u64,
}

/// The handle on the writer thread.
pub(super) struct Writer {
    tx: Mutex<Option<mpsc::Sender<WriteOp>>>,
    touches: PendingTouches,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Disconnects when the writer thread ends, so stopping it can wait with a deadline.
    done: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Writer {
    /// Starts the thread. `backfill` is told of every entry stored without a vector.
    pub(super) fn start(
        store: Arc<dyn Store>,
        index: Option<Arc<dyn VectorIndex>>,
        backfill: Option<Arc<Backfill>>,
        budget: Budget,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<WriteOp>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let touches = PendingTouches::default();
        let pending = touches.clone();
        let thread = std::thread::Builder::new()
            .name("reprise-writer".into())
            .spawn(move || {
                // Dropped when the loop ends, however it ends.
                let _done = done_tx;
                writer_loop(store, index, backfill, rx, &pending, budget);
            })
            .ok();
        Self {
            tx: Mutex::new(Some(tx)),
            touches,
            thread: Mutex::new(thread),
            done: Mutex::new(Some(done_rx)),
        }
    }

    /// Notes a hit on an entry; the writer records the hits in batches.
    pub(super) fn note_hit(&self, id: EntryId, hit: HitEvent) {
        lock(&self.touches).entry(id).or_default().add(hit);
    }

    pub(super) fn send(&self, op: WriteOp) {
        if let Some(tx) = lock(&self.tx).as_ref() {
            let _ = tx.send(op);
        }
    }

    /// Stores `entry` through the writer and waits for its id, at most `within`: for a caller on a
    /// blocking thread that must answer only once the entry is stored. `None` when the writer has
    /// stopped or did not get to it in time (the entry may still be stored).
    pub(super) fn put_now(
        &self,
        entry: Entry,
        within: Duration,
    ) -> Option<Result<EntryId, StoreError>> {
        let (tx, rx) = mpsc::channel();
        self.send(WriteOp::PutNow(Box::new(entry), tx));
        rx.recv_timeout(within).ok()
    }

    /// Waits until every write queued so far has landed and the store is flushed, at most `within`.
    pub(super) fn flush(&self, within: Duration) {
        let (tx, rx) = mpsc::channel();
        self.send(WriteOp::Flush(tx));
        let _ = rx.recv_timeout(within);
    }

    /// Ends the writer thread (it applies what is queued and flushes first); false if it has not
    /// ended within `within`.
    pub(super) fn stop(&self, within: Duration) -> bool {
        lock(&self.tx).take();
        let Some(done) = lock(&self.done).take() else {
            return true;
        };
        match done.recv_timeout(within) {
            Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "the cache writer did not finish in time (a store write is stuck): exiting \
                     without it; writes still queued are lost"
                );
                false
            }
            _ => {
                if let Some(thread) = lock(&self.thread).take() {
                    let _ = thread.join();
                }
                true
            }
        }
    }
}

/// Stores a new entry; the index learns of it once the store holds it.
fn put(
    store: &dyn Store,
    index: Option<&dyn VectorIndex>,
    backfill: Option<&Backfill>,
    entry: Box<Entry>,
) -> Result<EntryId, StoreError> {
    let vector = entry.vector.clone().map(|v| (entry.partition.0, v));
    let unembedded = crate::backfill::wants_vector(&entry);
    let stored = store.put(*entry);
    match &stored {
        Ok(id) => {
            if let (Some(index), Some((partition, vector))) = (index, vector) {
                index.insert(id.0, partition, &vector);
            }
            // Its miss skipped the embedding: the vector comes later, off this path.
            if let Some(backfill) = backfill.filter(|_| unembedded) {
                backfill.enqueue(*id);
            }
        }
        // At debug: a failing store logs its state once, not once per answer.
        Err(err) => tracing::debug!(error = %err, "storing a cache entry failed"),
    }
    // Now, before a disk-budget rebuild replaces the store and what it noted.
    forget_dropped(store, index);
    stored
}

/// Removes from the index the entries the store dropped on its own (a put's older entry of the
/// same key, evictions, expiry): searches would skip them anyway, but the index would hold their
/// vectors and dump ids the store no longer has, and the next start would rebuild it whole.
fn forget_dropped(store: &dyn Store, index: Option<&dyn VectorIndex>) {
    let dropped = store.take_dropped();
    if let Some(index) = index {
        for id in dropped {
            index.remove(id.0);
        }
    }
}

/// The writer thread's loop.
fn writer_loop(
    store: Arc<dyn Store>,
    index: Option<Arc<dyn VectorIndex>>,
    backfill: Option<Arc<Backfill>>,
    rx: mpsc::Receiver<WriteOp>,
    pending: &Mutex<HashMap<EntryId, Touches>>,
    budget: Budget,
) {
    let interval = Duration::from_millis(budget.sweep_interval_ms.max(10));
    let mut last_sweep = Instant::now();
    // Takes the hits noted so far, leaving the lock at once.
    let take = || std::mem::take(&mut *lock(pending));
    let mut dirty = false;
    // The caps hold at every put from here (the store evicts before it writes); sweeps only expire
    // entries and delete unreadable ones.
    let (entries, bytes) = (store.len(), store.bytes());
    let over = entries > budget.max_entries || bytes > budget.max_bytes;
    if over {
        // Said before it starts: a cache restarted with smaller caps (or none given, on a store a
        // larger cap filled) loses entries for good, possibly most of them, and the eviction keeps
        // the writer busy meanwhile.
        tracing::warn!(
            entries,
            bytes,
            max_entries = budget.max_entries,
            max_bytes = budget.max_bytes,
            "the store is over its caps (--max-entries, --max-bytes): evicting the least recently \
             used entries down to them"
        );
    }
    match store.set_caps(budget.max_entries, budget.max_bytes) {
        Ok(()) if over => {
            let (left, left_bytes) = (store.len(), store.bytes());
            let evicted = entries.saturating_sub(left);
            // sled evicts here at once; a store that leaves its caps to the sweeps (Redis) is
            // brought down by them, a batch at a time.
            if left > budget.max_entries || left_bytes > budget.max_bytes {
                tracing::warn!(evicted, left, "the rest is left to the cache's sweeps");
            } else {
                tracing::warn!(evicted, left, "evicted down to the store's caps");
            }
        }
        Ok(()) => {}
        Err(err) => tracing::warn!(error = %err, "evicting down to the store's caps failed"),
    }
    loop {
        let op = rx.recv_timeout(interval);
        match op {
            Ok(WriteOp::Put(entry)) => {
                let _ = put(store.as_ref(), index.as_deref(), backfill.as_deref(), entry);
                dirty = true;
                // sled's log grows with every put, and one burst can write many budgets' worth
                // between two sweeps: checked here (a stat), the files pass their budget by one
                // answer's writes at most.
                store.enforce_disk_budget(budget.max_bytes);
            }
            Ok(WriteOp::PutRecorded(mut entry, recorded)) => {
                let events: Option<Vec<StoredEvent>> = recorded
                    .iter()
                    .map(|(offset_ms, event)| {
                        Some(StoredEvent {
                            offset_ms: *offset_ms,
                            data: super::tape::chunk_of(event)?,
                        })
                    })
                    .collect();
                drop(recorded);
                // The recorder parsed the same bytes before it sent them: always `Some`.
                if let Some(events) = events {
                    entry.events = events;
                    let _ = put(store.as_ref(), index.as_deref(), backfill.as_deref(), entry);
                    dirty = true;
                }
            }
            Ok(WriteOp::PutNow(entry, reply)) => {
                let _ = reply.send(put(
                    store.as_ref(),
                    index.as_deref(),
                    backfill.as_deref(),
                    entry,
                ));
                dirty = true;
                store.enforce_disk_budget(budget.max_bytes);
            }
            Ok(WriteOp::Flush(done)) => {
                apply_touches(store.as_ref(), &mut take());
                if let Err(err) = store.flush() {
                    tracing::debug!(error = %err, "flushing the store failed");
                }
                let _ = done.send(());
            }
            Ok(WriteOp::Release(key, token)) => {
                // A claim left held lapses at its expiry: waiting replicas are late, not wrong.
                if let Err(err) = crate::store::release(store.as_ref(), &key, &token) {
                    tracing::debug!(error = %err, "releasing a single-flight claim failed");
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                apply_touches(store.as_ref(), &mut take());
                forget_dropped(store.as_ref(), index.as_deref());
                // The last write: the store may leave what makes the next start fast.
                if let Err(err) = store.close() {
                    tracing::warn!(error = %err, "closing the store failed; the next start scans it");
                }
                return;
            }
        }
        forget_dropped(store.as_ref(), index.as_deref());
        // Degraded (its disk failed): try to reopen it, busy or not; the store rate-limits this.
        if store.degraded().is_some() {
            store.recover();
        }
        // Hit counts are batched; TTL expiry and caps are enforced in the same quiet moments.
        if last_sweep.elapsed() >= interval || dirty && store.len() > budget.max_entries {
            apply_touches(store.as_ref(), &mut take());
            match store.sweep(unix_ms(), budget.max_entries, budget.max_bytes) {
                Ok((expired, evicted)) if expired + evicted > 0 => {
                    tracing::debug!(expired, evicted, "cache sweep");
                }
                Ok(_) => {}
                Err(err) => tracing::debug!(error = %err, "cache sweep failed"),
            }
            // sled's log may hold far more than the live entries: rebuild it past its budget.
            forget_dropped(store.as_ref(), index.as_deref());
            store.enforce_disk_budget(budget.max_bytes);
            last_sweep = Instant::now();
            dirty = false;
        }
    }
}

/// Hits on one entry since the last write of them.
#[derive(Default)]
pub(super) struct Touches {
    count: u64,
    recent: VecDeque<HitEvent>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{RequestSummary, StoredEvent};
    use crate::key::PartitionKey;
    use crate::store::{ResilientStore, SledStore};
    use crate::timing::Phases;
    use serde_json::json;

    /// An answer as a 1,500-token stream leaves it (about 400 kB stored, the churn): one
    /// chunk per token, each with its id, `created` and model.
    fn long_answer(n: u64) -> Entry {
        let events: Vec<StoredEvent> = (0..1_500)
            .map(|t| StoredEvent {
                offset_ms: t as f64,
                data: json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk",
                    "created": 1_700_000_000u64 + n, "model": "sim-1", "system_fingerprint": "fp_x",
                    "choices": [{"index": 0, "delta": {"content": format!(" tok{t}-{n}")},
                        "logprobs": null, "finish_reason": null}]}),
            })
            .collect();
        let text: String = (0..1_500).map(|t| format!(" tok{t}-{n}")).collect();
        Entry {
            id: EntryId(0),
            key: CacheKey(*blake3::hash(&n.to_le_bytes()).as_bytes()),
            partition: PartitionKey([1; 32]),
            summary: RequestSummary {
                route: "chat.completions".into(),
                model: "sim-1".into(),
                namespace: None,
                tenant: "shared".into(),
                prompt: format!("question {n}"),
                stream: true,
            },
            events,
            body: json!({"choices": [{"message": {"content": text}}]}),
            usage: Some(json!({"completion_tokens": 1_500})),
            phases: Phases {
                ttft_ms: Some(120.0),
                total_ms: 900.0,
                ..Phases::default()
            },
            created_at_ms: unix_ms(),
            ttl_ms: 3_600_000,
            hit_count: 0,
            last_hit_ms: 0,
            vector: None,
            hit_history: Vec::new(),
            warmed: false,
        }
    }

    /// The gateway's store and writer, with sweeps an hour apart so that only the writes enforce
    /// the caps (as between two sweeps of a busy gateway).
    fn writer_on(dir: &std::path::Path, max_bytes: u64) -> (Arc<ResilientStore>, Writer) {
        let store = Arc::new(ResilientStore::new(
            dir,
            SledStore::open(dir).expect("open store"),
        ));
        let budget = Budget {
            max_entries: usize::MAX,
            max_bytes,
            sweep_interval_ms: 3_600_000,
        };
        let writer = Writer::start(store.clone(), None, None, budget);
        (store, writer)
    }

    #[test]
    fn the_ledger_holds_max_bytes_after_every_put_between_sweeps() {
        const MAX_BYTES: u64 = 2_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, writer) = writer_on(dir.path(), MAX_BYTES);
        let mut peak = 0;
        for n in 0..40 {
            writer.send(WriteOp::Put(Box::new(long_answer(n))));
            writer.flush(Duration::from_secs(30));
            peak = peak.max(store.bytes());
            assert!(
                store.bytes() <= MAX_BYTES,
                "after put {n}: {} entries, {} bytes > {MAX_BYTES}",
                store.len(),
                store.bytes()
            );
            // The newest answer is the one kept: eviction takes the least recently used.
            let newest = long_answer(n).key;
            assert!(
                store.replay_by_key(&newest).expect("read").is_some(),
                "put {n} stored"
            );
        }
        assert!(peak > MAX_BYTES / 2, "{peak}: answers too small to test");
        assert!(writer.stop(Duration::from_secs(30)));
    }

    #[test]
    fn the_index_forgets_what_the_store_dropped_replaced_and_evicted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(ResilientStore::new(
            dir.path(),
            SledStore::open(dir.path()).expect("open store"),
        ));
        let index = Arc::new(crate::index::HnswIndex::new(
            crate::index::IndexConfig::new(2),
        ));
        let budget = Budget {
            max_entries: 3,
            max_bytes: u64::MAX,
            sweep_interval_ms: 3_600_000,
        };
        let writer = Writer::start(store.clone(), Some(index.clone()), None, budget);
        let with_vector = |n: u64, key: u64| {
            let mut entry = long_answer(key);
            entry.events.truncate(2);
            entry.vector = Some(vec![1.0, n as f32]);
            Box::new(entry)
        };
        // The same key twice: the first entry goes from the store, and from the index with it.
        writer.send(WriteOp::Put(with_vector(1, 1)));
        writer.send(WriteOp::Put(with_vector(2, 1)));
        writer.flush(Duration::from_secs(30));
        assert_eq!((store.len(), index.len()), (1, 1));
        // Past the cap of 3 entries: the evicted one leaves the index too.
        for n in 2..=4 {
            writer.send(WriteOp::Put(with_vector(n + 1, n)));
        }
        writer.flush(Duration::from_secs(30));
        assert_eq!((store.len(), index.len()), (3, 3));
        let stored: std::collections::BTreeSet<u64> = store
            .ids()
            .expect("ids")
            .into_iter()
            .map(|id| id.0)
            .collect();
        let indexed: std::collections::BTreeSet<u64> = index
            .scan_all(&[1.0, 0.0], -1.0, 10)
            .into_iter()
            .map(|n| n.id)
            .collect();
        assert_eq!(
            indexed, stored,
            "what a dump would hold is what the store holds"
        );
        assert!(writer.stop(Duration::from_secs(30)));
    }

    #[test]
    fn the_data_dir_stays_within_its_stated_bound_sampled_during_churn() {
        const MAX_BYTES: u64 = 2_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, writer) = writer_on(dir.path(), MAX_BYTES);
        let done = std::sync::atomic::AtomicBool::new(false);
        let bound = crate::store::disk_bound(MAX_BYTES);
        let (peak, samples) = std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                let (mut peak, mut samples) = (0, 0u64);
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(crate::store::disk_usage_racy(dir.path()));
                    samples += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                (peak.max(crate::store::disk_usage_racy(dir.path())), samples)
            });
            // Queued as a burst, the way a busy gateway hands them over.
            for n in 0..300 {
                writer.send(WriteOp::Put(Box::new(long_answer(n))));
            }
            writer.flush(Duration::from_secs(300));
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            sampler.join().expect("sampler")
        });
        eprintln!(
            "churn: data dir peaked at {peak} bytes over {samples} samples (bound {bound}), ended at {}, {} entries, {} bytes",
            crate::store::disk_usage_racy(dir.path()),
            store.len(),
            store.bytes()
        );
        assert!(store.bytes() <= MAX_BYTES);
        assert!(peak <= bound, "data dir peaked at {peak} bytes > {bound}");
        assert!(writer.stop(Duration::from_secs(30)));
    }
}
