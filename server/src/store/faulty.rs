//! Test only: a [`Store`] around another whose whole-store reads ([`Store::ids`], [`Store::cold`],
//! which a semantic search also reads its candidates with) fail as many times as a test asks, as
//! Redis does during a failover, which lists no ledger of ids (as Redis), so callers read through
//! those calls, and which can lose an entry's replay alone (as Redis can evict one half of an
//! entry). Everything else passes through.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{Store, StoreError, Upkeep};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

pub(crate) struct FaultyReads<S> {
    pub(crate) inner: S,
    /// Whole-store reads left to fail; each failure counts one down.
    pub(crate) failures: AtomicUsize,
    /// Whole-store reads that succeed before the failures start.
    pub(crate) good_reads: AtomicUsize,
    /// Entries whose replay reads as gone.
    pub(crate) lost_replays: Mutex<HashSet<EntryId>>,
    /// Entries asked for through [`Store::cold`] so far.
    pub(crate) cold_asked: AtomicUsize,
}

impl<S> FaultyReads<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            failures: AtomicUsize::new(0),
            good_reads: AtomicUsize::new(0),
            lost_replays: Mutex::default(),
            cold_asked: AtomicUsize::new(0),
        }
    }

    /// From now on `id`'s replay reads as gone, its cold half still there.
    pub(crate) fn lose_replay(&self, id: EntryId) {
        crate::lock::lock(&self.lost_replays).insert(id);
    }

    /// After `good_reads` more whole-store reads pass, the next `failures` fail.
    pub(crate) fn fail(&self, failures: usize, good_reads: usize) {
        self.good_reads.store(good_reads, Ordering::SeqCst);
        self.failures.store(failures, Ordering::SeqCst);
    }

    fn failing(&self) -> Result<(), StoreError> {
        let count_down = |counter: &AtomicUsize| {
            counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        if count_down(&self.good_reads) || !count_down(&self.failures) {
            return Ok(());
        }
        Err(StoreError::Unavailable)
    }
}

impl<S: Store> Store for FaultyReads<S> {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.inner.get(id)
    }

    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        self.inner.get_by_key(key)
    }

    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError> {
        self.inner.replay_by_key(key)
    }

    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        if crate::lock::lock(&self.lost_replays).contains(&id) {
            return Ok(None);
        }
        self.inner.replay(id)
    }

    fn put(&self, entry: Entry) -> Result<EntryId, StoreError> {
        self.inner.put(entry)
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        self.inner.delete(id)
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        self.inner.touch(id, hits, recent)
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.inner.set_vector(id, vector)
    }

    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.inner.replace_vector(id, vector)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.list_newest(before, limit)
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.list(after, limit)
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.failing()?;
        self.inner.ids()
    }

    fn cold(&self, ids: &[EntryId]) -> Result<Vec<Entry>, StoreError> {
        self.failing()?;
        self.cold_asked.fetch_add(ids.len(), Ordering::SeqCst);
        self.inner.cold(ids)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn bytes(&self) -> u64 {
        self.inner.bytes()
    }
}

impl<S: Store> Upkeep for FaultyReads<S> {
    fn sweep(&self, now_ms: u64, entries: usize, bytes: u64) -> Result<(usize, usize), StoreError> {
        self.inner.sweep(now_ms, entries, bytes)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn clear(&self) -> Result<usize, StoreError> {
        self.inner.clear()
    }
}
